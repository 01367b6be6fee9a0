"""The wheel works as users install it: built, installed non-editable into a fresh virtual environment, and run.

The tests elsewhere import the checkout; a user gets the wheel, where the compiled kernels' C++ sources and the
guide pages travel as package data and data files, and a file left out of ``pyproject.toml`` only shows there. So
this builds the wheel from a copy of the checkout (a stale ``build/`` folder in the checkout could carry files that
no longer exist), checks what it carries, installs it with ``--no-deps`` into a venv that sees this machine's torch
and dependencies, and runs ``gpt1 --help`` and prepare → pretrain → eval from that install, outside the checkout.
Offline throughout: the build uses this machine's setuptools (``--no-build-isolation``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
KERNELS = ROOT / "gptcli" / "model" / "kernels"

TINY = [
    *("--preset", "tiny", "--n-layer", "1", "--n-embd", "32", "--n-head", "2", "--n-inner", "64", "--n-ctx", "32"),
    *("--seq-len", "32", "--batch-size", "4", "--warmup-steps", "1", "--eval-batches", "1", "--max-steps", "2"),
    "--quiet",
]
RUNTIME = ["--device", "cpu", "--precision", "fp32"]


def _copy_checkout(dest: Path) -> Path:
    """What the wheel is built from: the project file, the README, the package and the guide pages."""
    dest.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, dest / name)
    shutil.copytree(ROOT / "gptcli", dest / "gptcli", ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.pyc"))
    (dest / "docs").mkdir()
    for page in (ROOT / "docs").glob("*.md"):
        shutil.copy2(page, dest / "docs" / page.name)
    return dest


def _clean_env(home: Path) -> dict[str, str]:
    """No PYTHONPATH (the checkout must not be imported), offline, caches of the test's own."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env.update(HF_HUB_OFFLINE="1", GPT1_DATA=str(home / "data"), GPT1_MODELS=str(home / "models"), COLUMNS="200")
    return env


def _run(args: list, cwd: Path, env: dict[str, str], timeout: float = 300) -> str:
    proc = subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{args}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


def _write_corpus_text(folder: Path) -> None:
    """Plain English that ships with Python: the standard library's module docstrings (as the quickstart uses)."""
    import argparse
    import collections
    import decimal
    import email
    import http.server
    import json
    import logging
    import pathlib
    import subprocess as sp
    import textwrap
    import unittest

    folder.mkdir()
    docs = [m.__doc__ or "" for m in (argparse, collections, decimal, email, http.server, json, logging)]
    docs += [m.__doc__ or "" for m in (pathlib, sp, textwrap, unittest)]
    (folder / "stdlib.txt").write_text("\n\n".join(d.strip() for d in docs if d.strip()) + "\n", encoding="utf-8")


@pytest.mark.slow
def test_the_installed_wheel_runs_the_pipeline(tmp_path: Path) -> None:
    env = _clean_env(tmp_path)

    # Build, from a copy of the checkout.
    dist = tmp_path / "dist"
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-q",
            "-w",
            dist,
            ".",
        ],
        _copy_checkout(tmp_path / "gpt1"),
        env,
    )
    (wheel,) = dist.glob("gpt1-*.whl")

    # What it carries: every C++ source of the kernels (whatever they are called today) and every guide page.
    names = set(zipfile.ZipFile(wheel).namelist())
    sources = sorted(p.name for p in KERNELS.iterdir() if p.suffix in (".cpp", ".h"))
    assert sources, "no C++ sources found in the checkout's kernels folder"
    assert [s for s in sources if f"gptcli/model/kernels/{s}" not in names] == []
    pages = sorted(p.name for p in (ROOT / "docs").glob("*.md"))
    data = next(n.split("/data/")[0] for n in names if n.endswith(".data/data/share/doc/gpt1/index.md"))
    assert [p for p in pages if f"{data}/data/share/doc/gpt1/{p}" not in names] == []

    # Install, non-editable, into a fresh venv that takes torch and the dependencies from this machine.
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(system_site_packages=True, with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    _run(
        [sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index", "-q", wheel],
        tmp_path,
        env,
    )
    work = tmp_path / "work"
    work.mkdir()
    where = _run(
        [python, "-c", "import gptcli, gptcli.guide as g; print(gptcli.__file__); print(g.page('index.md'))"], work, env
    )
    module, page = where.splitlines()[-2:]
    assert Path(module).is_relative_to(env_dir) and not Path(module).is_relative_to(ROOT), module
    assert Path(page).is_relative_to(env_dir) and Path(page).is_file(), page

    # Run it: the command line, then prepare → pretrain 2 updates → eval, from the venv's own `gpt1`.
    gpt1 = env_dir / "bin" / "gpt1"
    assert "pretrain" in _run([gpt1, "--help"], work, env)
    _write_corpus_text(work / "text")
    _run([gpt1, "prepare", work / "text", "--out", work / "corpus", "--vocab-size", "120", "--workers", "1"], work, env)
    _run([gpt1, "pretrain", "--data", work / "corpus", "--out", work / "pre", *TINY, *RUNTIME], work, env)
    out = _run(
        [gpt1, "eval", "--checkpoint", work / "pre", "--data", work / "corpus", "--max-batches", "2", *RUNTIME],
        work,
        env,
    )
    assert "perplexity" in out.lower(), out
