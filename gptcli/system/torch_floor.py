"""The oldest PyTorch gpt1 runs on, checked before a command starts.

pip enforces ``pyproject.toml``'s ``torch>=…`` at install time, but not always: ``pip install --no-deps``, an
environment whose torch another tool installed, or pip's own "dependency conflicts" warning (it installs anyway)
leave an older torch in place, and then a run would fail minutes in, inside training, with an ``AttributeError``
(torch 2.4: ``torch.nn.utils.clip_grads_with_norm_`` first appeared in 2.6). The floor has one home, the installed
package's own requirement; this module reads it and the installed torch's version from the package metadata, so
that neither torch is imported nor the number written twice. A source checkout that was never installed has no
metadata and is not checked.

The floor is the oldest release the whole test suite passed on (pyproject.toml's comment says where that is recorded).
"""

from __future__ import annotations

import re
from importlib import metadata

from gptcli.errors import GPT1Error

_RELEASE = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?")


def release(version: str) -> tuple[int, int, int]:
    """``"2.6.0+cu124"`` → ``(2, 6, 0)``: the release numbers only. A pre-release or local build (NVIDIA's
    ``2.6.0a0+ecf3bae40a``) counts as its release: such builds are cut from that release's branch."""
    m = _RELEASE.match(version.strip())
    if m is None:
        raise ValueError(f"not a version: {version!r}")
    return int(m[1]), int(m[2]), int(m[3] or 0)


def torch_floor(requires: list[str] | None) -> str | None:
    """The ``X.Y[.Z]`` of the ``torch>=X.Y[.Z]`` among a package's requirements (None: there is none)."""
    for req in requires or ():
        spec = re.fullmatch(r"torch(?![\w.-])\s*(?:\[[^\]]*\])?\s*([^;]*)(?:;.*)?", req.strip())  # not torchvision
        floor = re.search(r">=\s*([0-9][0-9.]*)", spec[1]) if spec else None
        if floor:
            return floor[1]
    return None


def check_torch(installed: str | None = None, floor: str | None = None) -> None:
    """Raise :class:`GPT1Error` when the installed torch is older than gpt1's floor. Either value is read from the
    package metadata unless given (tests give them); with no metadata for either, or a version this cannot read (a
    build's own naming), nothing is checked: the check must never be what stops a working install."""
    try:
        installed = installed or metadata.version("torch")
        floor = floor or torch_floor(metadata.requires("gpt1"))
        if floor is None or release(installed) >= release(floor):
            return
    except (metadata.PackageNotFoundError, ValueError):
        return
    raise GPT1Error(
        f"PyTorch {installed} is installed; gpt1 needs torch>={floor} "
        f'(upgrade it: pip install "torch>={floor}", or for a CUDA build the command pytorch.org '
        f"gives for your CUDA version)"
    )


__all__ = ["check_torch", "release", "torch_floor"]
