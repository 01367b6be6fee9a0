"""The quickstart's text: the docstrings of Python's standard library, the English prose every Python installation
ships (nothing is downloaded, nothing is copied into the repository).

Each module with docstrings is one document: its module, class and function docstrings read with :mod:`ast`, in
source order, without their doctest examples; modules come in sorted path order, so the text is the same on every
run with the same Python. :func:`hold_out` then draws, with a seed, the whole modules the quickstart keeps out of
pretraining to make its toy task from (:mod:`gptcli.pipelines.quickstart`, stage 1).
"""

from __future__ import annotations

import ast
import random
import sysconfig
from collections.abc import Iterator
from pathlib import Path

from gptcli.errors import GPT1Error

# Standard-library folders that are not documentation prose (tests, the IDLE test suite, installed packages).
SKIP_DIRS = frozenset({"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"})

Document = tuple[str, str]
"""``(module, text)``: a module's dotted name and its docstrings."""


def stdlib_root(root: str | Path | None = None) -> Path:
    """The folder docstrings are read from: ``root``, or this Python's standard library."""
    return Path(root) if root is not None else Path(sysconfig.get_paths()["stdlib"])


def _docstrings(tree: ast.AST) -> Iterator[str]:
    """Module, class and function docstrings in source order."""
    nodes = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    if isinstance(tree, nodes):
        doc = ast.get_docstring(tree, clean=True)
        if doc:
            yield doc
    for child in ast.iter_child_nodes(tree):
        if isinstance(child, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) or not isinstance(child, ast.expr):
            yield from _docstrings(child)


def strip_doctests(doc: str) -> str:
    """``doc`` without its doctest examples: each ``>>>`` line and the lines after it up to a blank line."""
    kept: list[str] = []
    in_example = False
    for line in doc.split("\n"):
        if line.lstrip().startswith(">>>"):
            in_example = True
        elif not line.strip():
            in_example = False
        if not in_example:
            kept.append(line)
    return "\n".join(kept).strip()


def stdlib_documents(root: str | Path | None = None, max_modules: int | None = None) -> list[Document]:
    """``(module, text)`` for every module under ``root`` (default: this Python's standard library) that has
    docstrings, in sorted path order; doctest examples are left out. Unparsable files are skipped."""
    base = stdlib_root(root)
    if not base.is_dir():
        raise GPT1Error(f"{base}: no such folder to read docstrings from")
    docs: list[Document] = []
    for path in sorted(base.rglob("*.py")):
        rel = path.relative_to(base)
        if SKIP_DIRS.intersection(rel.parts[:-1]):
            continue
        try:
            tree = ast.parse(path.read_bytes(), filename=str(path))
        except (SyntaxError, ValueError, OSError):
            continue  # e.g. lib2to3 test data written in Python 2
        parts = [strip_doctests(d) for d in _docstrings(tree)]
        text = "\n\n".join(p for p in parts if p)
        if text:
            module = ".".join(rel.with_suffix("").parts).removesuffix(".__init__")
            docs.append((module, text))
            if max_modules is not None and len(docs) >= max_modules:
                break
    if len(docs) < 4:
        raise GPT1Error(f"{base}: found docstrings in only {len(docs)} modules; need at least 4")
    return docs


def hold_out(docs: list[Document], fraction: float, seed: int) -> tuple[list[Document], list[Document]]:
    """Split documents into (pretraining, held out for the task) by a seeded draw of whole modules."""
    n = max(1, min(len(docs) - 2, round(fraction * len(docs))))
    held = set(random.Random(seed).sample(range(len(docs)), n))
    return [d for i, d in enumerate(docs) if i not in held], [d for i, d in enumerate(docs) if i in held]
