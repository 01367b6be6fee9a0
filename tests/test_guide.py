"""gptcli/guide.py: messages name guide pages that exist on the user's machine, in a checkout and in a wheel."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from gptcli import guide
from gptcli.pipelines.quickstart import WHAT_NEXT

ROOT = Path(__file__).resolve().parent.parent


def _pages_named() -> set[str]:
    """Every guide page the package's messages name: the quickstart's closing lines, and the index."""
    return {doc for _, _, doc in WHAT_NEXT} | {"index.md", "datasets.md"}


def test_a_checkout_names_its_own_docs_folder(monkeypatch) -> None:
    monkeypatch.chdir(ROOT)
    for name in _pages_named():
        assert guide.page(name) == f"docs/{name}"
    monkeypatch.chdir(ROOT / "tests")  # elsewhere: the absolute path, still a file that exists
    assert Path(guide.page("finetune.md")) == ROOT / "docs" / "finetune.md"


def test_an_installed_package_names_the_copy_under_its_prefix(tmp_path, monkeypatch) -> None:
    """A wheel has no docs/ beside the package; pip puts the pages under <prefix>/share/doc/gpt1."""
    site_packages = tmp_path / "lib" / "site-packages" / "gptcli"
    site_packages.mkdir(parents=True)
    installed = tmp_path / "share" / "doc" / "gpt1"
    installed.mkdir(parents=True)
    for name in ("index.md", "finetune.md"):
        (installed / name).write_text("# page\n")
    monkeypatch.setattr(guide, "__file__", str(site_packages / "guide.py"))
    monkeypatch.setattr(sys, "prefix", str(tmp_path))
    monkeypatch.setattr(guide.site, "USER_BASE", str(tmp_path / "nothing"))
    monkeypatch.chdir(tmp_path / "lib")
    assert guide.guide_dir() == installed
    assert guide.page("finetune.md") == str(installed / "finetune.md")
    assert guide.page("missing.md") == "docs/missing.md in gpt1's source"  # never a path that does not exist


def test_without_a_guide_the_source_tree_is_named(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(guide, "__file__", str(tmp_path / "gptcli" / "guide.py"))
    monkeypatch.setattr(sys, "prefix", str(tmp_path))
    monkeypatch.setattr(guide.site, "USER_BASE", None)
    assert guide.guide_dir() is None
    assert guide.page("datasets.md") == "docs/datasets.md in gpt1's source"


def test_the_wheel_carries_every_page_the_messages_name() -> None:
    """pyproject's data-files pattern covers each named page, and each exists in docs/."""
    text = (ROOT / "pyproject.toml").read_text()
    spec = re.search(r'^data-files = \{ "share/doc/gpt1" = \["([^"]+)"\] \}$', text, re.MULTILINE)
    assert spec is not None and Path(*guide.INSTALLED.parts) == Path("share/doc/gpt1")
    carried = {p.name for p in ROOT.glob(spec[1])}
    assert _pages_named() <= carried


def test_a_missing_task_folder_names_a_real_datasets_page(tmp_path, monkeypatch) -> None:
    """A task without an official address (one a user registers) points at the guide's datasets page."""
    from dataclasses import replace

    from gptcli.errors import GPT1Error
    from gptcli.tasks import get_task

    monkeypatch.chdir(ROOT)
    task = replace(get_task("rte"), source_url=None)
    with pytest.raises(GPT1Error, match=r"see docs/datasets\.md\)$"):
        task.data_dir(tmp_path / "absent")
