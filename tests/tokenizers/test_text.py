"""Cleaning, standardization (golden cases of the released code), spaCy words and Gutenberg stripping."""

from __future__ import annotations

import pytest

from gptcli.tokenizers.text import clean, fix, standardize, strip_gutenberg, word_lines

# (input, what the released `text_standardize` returns) — worked out by hand from its code.
GOLDEN = [
    ("Hello, world!", "Hello , world !"),
    ("em—dash en–dash bar―x", "em - dash en - dash bar - x"),
    ("wait…", "wait..."),
    ("it´s", "it's"),
    ("a--b", "a -- b"),
    ('say "hi"', 'say " hi "'),
    ("x;y?z", "x ; y ? z"),
    ("(a)[b]{c}", "( a ) [ b ] { c }"),
    ("1+1=2", "1 + 1=2"),
    ("a/b*c|d_e~f", "a / b * c | d _ e ~ f"),
    ("!!!???", "!!! ???"),
    ("line one\r\n\r\n  line two", "line one \n line two"),
    ("  lots   of\t\tspace  ", "lots of space"),
    ("tail\n", "tail"),
    ("don't stop", "don't stop"),  # apostrophes are left to spaCy
    ("a.b:c", "a.b:c"),  # . and : are not in the punctuation class
]


@pytest.mark.parametrize("raw,expected", GOLDEN)
def test_standardize_golden(raw, expected):
    assert standardize(raw) == expected


def test_backslash_is_not_split_like_the_released_code():
    # The released pattern is a non-raw string: its `\\+` reaches the regex engine as `\+`, so backslashes are
    # never padded. Hugging Face's port (raw string) would give "a \\ b".
    assert standardize("a\\b") == "a\\b"
    assert standardize("C:\\dir\\file") == "C:\\dir\\file"
    assert standardize("a\\+b") == "a\\ + b"


def test_ftfy_fixes_mojibake_before_standardizing():
    assert fix("âœ” No problems") == "✔ No problems"
    assert clean("The Mona Lisa doesnÃ¢â‚¬â„¢t have eyebrows.") == "The Mona Lisa doesn't have eyebrows."
    assert clean("\ufeffBOM text") == "BOM text"


def test_fix_html_state_carries_between_chunks():
    # ftfy unescapes entities only until it meets a "<"; `html_seen` lets a later chunk continue that state.
    assert fix("a &amp; b") == "a & b"
    assert fix("a &amp; b", html_seen=True) == "a &amp; b"


def test_word_lines_lowercase_newlines_and_spacy_words():
    text = "Hello, World!\n\n\nI don't know—really…\r\nEnd."
    assert word_lines(text) == ["hello , world !", "i do n't know - really ...", "end ."]
    assert word_lines(text, cased=True)[0] == "Hello , World !"
    assert word_lines("   \n\n  ") == []
    assert word_lines("one\ntwo") == ["one", "two"]


def test_strip_gutenberg_synthetic():
    text = (
        "The Project Gutenberg eBook of X\r\nlicence blah\r\n"
        "*** START OF THE PROJECT GUTENBERG EBOOK X ***\r\nBody line 1\r\nBody line 2\r\n"
        "*** END OF THE PROJECT GUTENBERG EBOOK X ***\r\nMore licence\r\n"
    )
    body, found = strip_gutenberg(text)
    assert found
    assert body.strip() == "Body line 1\r\nBody line 2"
    assert strip_gutenberg("plain text") == ("plain text", False)
    body, found = strip_gutenberg("*** START OF THIS PROJECT GUTENBERG EBOOK Y ***\nonly start")
    assert found and body.strip() == "only start"


def test_strip_gutenberg_real_books(shared_data):
    books = sorted((shared_data / "books").glob("*.txt"))
    assert len(books) >= 50
    for path in books:
        raw = path.read_text(encoding="utf-8-sig")
        body, found = strip_gutenberg(raw)
        assert found, path.name
        assert "PROJECT GUTENBERG" not in body.upper().split("\n", 1)[0]
        assert "*** END OF" not in body
        assert "Project Gutenberg License" not in body, path.name
        assert len(body) > 0.5 * len(raw), path.name


def _released_text_standardize(text: str) -> str:
    """openai/finetune-transformer-lm `text_utils.text_standardize`, line for line (patterns as the regex
    engine receives them from its non-raw strings)."""
    import re

    from gptcli.tokenizers.text import RELEASED_PUNCT

    text = text.replace("—", "-")
    text = text.replace("–", "-")
    text = text.replace("―", "-")
    text = text.replace("…", "...")
    text = text.replace("´", "'")
    text = re.sub(RELEASED_PUNCT, r" \1 ", text)
    text = re.sub("\\s*\n\\s*", " \n ", text)
    text = re.sub("[^\\S\n]+", " ", text)
    return text.strip()


def test_fast_patterns_match_the_released_code_exactly():
    import random

    rng = random.Random(0)
    alphabet = list("-~!\";?+,)(/*[]}{|_\\ab .'") + ["\n", "\r\n", "\t", "  ", "\u00a0", "\u2003", "—", "…", "´"]
    for _ in range(20000):
        s = "".join(rng.choice(alphabet) for _ in range(rng.randrange(30)))
        assert standardize(s) == _released_text_standardize(s), repr(s)
    for raw, expected in GOLDEN:
        assert _released_text_standardize(raw) == expected


def test_fast_fix_equals_ftfy_fix_text():
    import random

    import ftfy

    rng = random.Random(1)
    pieces = [
        "plain words",
        " ",
        "\t",
        "\n",
        "\r\n",
        "\r",
        "&amp;",
        "&lt;",
        "<b>",
        "<",
        "\x0c",
        "\x0b",
        "\x1b[31m",
        "’",
        "“quoted”",
        "Ã©",
        "ﬁ",
        "ｗｉｄｅ",
        "\u2028",
        "\x85",
        "\x00",
        "café",
        "Â\xa0",
        "&",
        ";",
    ]
    for _ in range(3000):
        s = "".join(rng.choice(pieces) for _ in range(rng.randrange(12)))
        assert fix(s) == ftfy.fix_text(s), repr(s)
        assert fix(s, html_seen=True) == ftfy.fix_text(s, unescape_html=False), repr(s)


def test_fast_fix_on_real_books(shared_data):
    import ftfy

    for name in ("pg1952_yellow_wallpaper.txt", "pg41_legend_of_sleepy_hollow.txt"):
        raw = (shared_data / "books" / name).read_bytes().decode("utf-8-sig")  # CRLF kept, as prepare reads it
        assert fix(raw) == ftfy.fix_text(raw)
