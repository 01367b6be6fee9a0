"""The quickstart's text: standard-library docstrings, one document per module, and the held-out draw."""

from __future__ import annotations

from gptcli.pipelines.stdlib_text import hold_out, stdlib_documents, strip_doctests


def test_stdlib_documents_are_deterministic_docstrings(tmp_path):
    a = stdlib_documents(max_modules=15)
    assert a == stdlib_documents(max_modules=15) and len(a) == 15
    assert len({m for m, _ in a}) == 15 and all(t.strip() for _, t in a)
    # a folder of our own: module, class and function docstrings in source order; doctest lines left out
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text('"""Package doc."""\n')
    (tmp_path / "b.py").write_text(
        '"""Module doc.\n\n>>> 1 + 1\n2\n"""\n'
        'class C:\n    """Class doc."""\n    def f(self):\n        """Method doc."""\n'
    )
    (tmp_path / "a.py").write_text('def g():\n    """Function doc."""\n')
    (tmp_path / "bad.py").write_text("print 'python 2'\n")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "t.py").write_text('"""Test doc."""\n')
    (tmp_path / "z.py").write_text('"""Zed doc."""\n')
    docs = stdlib_documents(tmp_path)
    assert docs == [
        ("a", "Function doc."),
        ("b", "Module doc.\n\nClass doc.\n\nMethod doc."),
        ("pkg", "Package doc."),
        ("z", "Zed doc."),
    ]
    train, held = hold_out(docs, 0.25, seed=0)
    assert len(held) == 1 and sorted(train + held) == sorted(docs)


def test_strip_doctests_drops_each_example_up_to_a_blank_line():
    doc = "Add two numbers.\n\n>>> add(1, 2)\n3\n\nNegative numbers work too.\n    >>> add(-1, 1)\n    0"
    assert strip_doctests(doc) == "Add two numbers.\n\n\nNegative numbers work too."
