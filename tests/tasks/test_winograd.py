"""DPRD and WSC273 readers: locating the pronoun, possessives, and path:line errors."""

from __future__ import annotations

import pytest

from gptcli.errors import DataError
from gptcli.tasks.winograd import is_possessive, locate, read_dprd, read_wsc

DPRD = """The bee landed on the flower because it had pollen.
it
The bee,the flower
the flower

Ryan won the presidency against Tom because he feels he was the better candidate.
he
Ryan,Tom
Ryan

Randy went to Nick's store, and looked at his groceries.
his
Randy,Nick
Nick
"""


def test_dprd_blocks(tmp_path):
    p = tmp_path / "train.c.txt"
    p.write_text(DPRD, encoding="utf-8")
    s = read_dprd(p)
    assert len(s) == 3
    assert (s[0].before, s[0].pronoun, s[0].after) == ("The bee landed on the flower because ", "it", " had pollen.")
    assert s[0].candidates == ("The bee", "the flower") and s[0].label == 1
    assert s[0].substitute(0) == ("The bee landed on the flower because The bee", " had pollen.")
    assert s[0].source == f"{p}:1"
    # Two "he": the one after both candidates is the referring one.
    assert s[1].before.endswith("because ") and s[1].after == " feels he was the better candidate."
    assert s[1].source == f"{p}:6"
    # Possessive: candidate + 's.
    assert s[2].substitute(1)[0] == "Randy went to Nick's store, and looked at Nick's"


@pytest.mark.parametrize(
    "text, line, msg",
    [
        ("A sentence.\nit\nA,B\n", 1, "block of 4 lines"),
        ("ok it is.\nit\nA,B\nA\n\nAnother one.\nhe\nA;B\nA\n", 8, "two comma-separated candidates"),
        ("X saw Y and it ran.\nit\nX,Y\nZ\n", 4, "not one of the candidates"),
        ("X saw Y and ran.\nshe\nX,Y\nX\n", 2, "does not occur"),
    ],
)
def test_dprd_errors_name_path_and_line(tmp_path, text, line, msg):
    p = tmp_path / "bad.txt"
    p.write_text(text, encoding="utf-8")
    with pytest.raises(DataError, match=msg) as e:
        read_dprd(p)
    assert str(e.value).startswith(f"{p}:{line}: ")


def test_locate_rules():
    s = "The sword was stuck in the tree because it grew up around it."
    a, b = locate(s, "it", ("The sword", "the tree"))
    assert s[a:] == "it grew up around it."
    # Whole words only ("it" inside "its"/"with" is not a hit), case-insensitive.
    a, b = locate("With its owner gone, It fell.", "it", ("owner",))
    assert (a, b) == (21, 23)
    assert locate("No pronoun here.", "he", ("A", "B")) is None
    # Candidate not in the sentence: first occurrence.
    assert locate("he said he would", "he", ("Zed", "Q")) == (0, 2)


def test_her_object_or_possessive():
    assert not is_possessive("her", " to the hospital.")
    assert not is_possessive("her", " a present.")
    assert is_possessive("her", " birthday.")
    assert is_possessive("her", " back, the woman smiled.")
    assert is_possessive("his", " bishop.") and not is_possessive("him", " the key.")


WSC = """<?xml version="1.0" encoding="ISO-8859-1"?>
<collection>
<schema>
<text>
<txt1>The trophy doesn't fit into the brown suitcase because
</txt1>
<pron> it  </pron>
<txt2> is too large.
</txt2>
</text>
<answers>
<answer>the trophy </answer>
<answer>the suitcase</answer>
</answers>
<correctAnswer> A  </correctAnswer>
</schema>
<schema>
<text><txt1>Lily spoke to Donna, breaking</txt1><pron>her</pron><txt2>silence.</txt2></text>
<answers><answer>Lily</answer><answer>Donna</answer></answers>
<correctAnswer>B.</correctAnswer>
</schema>
</collection>
"""


def test_wsc_xml(tmp_path):
    p = tmp_path / "WSCollection.xml"
    p.write_text(WSC, encoding="latin-1")
    s = read_wsc(p)
    assert len(s) == 2
    assert s[0].sentence == "The trophy doesn't fit into the brown suitcase because it is too large."
    assert s[0].label == 0 and s[0].source == f"{p}:3"
    assert s[1].label == 1 and s[1].substitute(1) == ("Lily spoke to Donna, breaking Donna's", " silence.")


def test_wsc_errors(tmp_path):
    p = tmp_path / "w.xml"
    p.write_text(
        WSC.replace("<correctAnswer> A  </correctAnswer>", "<correctAnswer>C</correctAnswer>"), encoding="latin-1"
    )
    with pytest.raises(DataError, match=r"w\.xml:3: schema 1: <correctAnswer> must be A or B"):
        read_wsc(p)
    p.write_text("<collection><schema>", encoding="latin-1")
    with pytest.raises(DataError, match="not valid XML"):
        read_wsc(p)


def test_real_files(shared_data):
    d = read_dprd(shared_data / "dprd" / "train.c.txt")
    assert len(d) == 1322 and sum(x.label for x in d) == 661
    for x in d:  # every sentence is rebuilt exactly around the located pronoun
        assert x.pronoun.lower() in {"it", "he", "she", "they", "him", "his", "her", "them", "its", "the man"}
    w = read_wsc(shared_data / "wsc" / "WSCollection.xml")
    assert len(w) == 273 and sum(x.label for x in w) == 136
    assert w[0].sentence == "The city councilmen refused the demonstrators a permit because they feared violence."


def test_schema_as_registry_example_and_back(tmp_path):
    from gptcli.tasks.winograd import Schema, as_example

    p = tmp_path / "train.c.txt"
    p.write_text(DPRD, encoding="utf-8")
    for k, s in enumerate(read_dprd(p)):
        ex = as_example(s, k)
        assert ex.texts == (s.before, s.pronoun, s.after) and ex.choices == s.candidates and ex.label == s.label
        assert (ex.uid, ex.source) == (str(k), s.source)
        assert Schema.of(ex) == s and Schema.of(ex).substitute(1) == s.substitute(1)
