"""Where this install keeps the user guide, so that a message names a page the user can open.

The guide is ``docs/*.md`` in the source tree. A wheel has no ``docs/`` folder, so the wheel carries the pages as
data files, which pip installs under ``<prefix>/share/doc/gpt1`` (pyproject.toml's ``data-files``; ``--user``
installs put them under the user base instead). A message that said "docs/finetune.md" to someone who ran
``pip install gpt1`` would name a file they do not have; :func:`page` names the one they do.
"""

from __future__ import annotations

import os
import site
import sys
from pathlib import Path

INSTALLED = Path("share", "doc", "gpt1")
"""Where the wheel's data files put the pages, under an installation prefix."""


def guide_dir() -> Path | None:
    """The folder holding this install's guide: the source checkout's ``docs/`` (an editable install, or running
    from the tree), else the installed copy under the environment's prefix or the user base; None when neither has
    it (a package copied in without its data files)."""
    candidates = [Path(__file__).resolve().parent.parent / "docs"]
    candidates += [Path(base) / INSTALLED for base in (sys.prefix, site.USER_BASE) if base]
    for folder in candidates:
        if (folder / "index.md").is_file():
            return folder
    return None


def page(name: str) -> str:
    """The path to show for guide page ``name`` (``"finetune.md"``): relative to the working directory when it lies
    below it (``docs/finetune.md`` in a checkout), else absolute; the plain ``docs/<name>`` of gpt1's source tree
    when this install has no guide."""
    folder = guide_dir()
    if folder is None or not (folder / name).is_file():
        return f"docs/{name} in gpt1's source"
    path = folder / name
    try:
        relative = os.path.relpath(path)
    except ValueError:  # another drive on Windows
        return str(path)
    return str(path) if relative.startswith("..") else relative


__all__ = ["INSTALLED", "guide_dir", "page"]
