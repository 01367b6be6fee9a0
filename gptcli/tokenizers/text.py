"""Text cleaning and word splitting, exactly as GPT-1's released code does it (reference §1).

``clean`` = ``ftfy.fix_text`` followed by the released ``text_standardize``; ``words`` = spaCy's English
tokenizer (``spacy.blank("en")``: rules only, no model download). Lowercasing and BPE belong to the tokenizer;
:func:`word_lines` produces exactly the text the BPE sees (words joined by single spaces, one line per newline
token). :func:`strip_gutenberg` removes Project Gutenberg headers and licence footers.
"""

from __future__ import annotations

import re
from functools import lru_cache

import ftfy

# The released code writes this pattern in a *non-raw* string, so its `\\+` reaches the regex engine as `\+`
# (a second literal-plus alternative) and backslashes are NOT split. Hugging Face's port uses a raw string and
# does split them. We follow the original; tests pin the backslash case.
RELEASED_PUNCT = r"""(-+|~+|!+|"+|;+|\?+|\++|,+|\)+|\(+|\++|\/+|\*+|\[+|\]+|}+|{+|\|+|_+)"""
# Same matches, several times faster: at any position at most one alternative of the released pattern can match (each
# starts with its own character) and it takes the longest run of that character — a class plus a backreference.
_PUNCT = re.compile(r"""([-~!";?+,)(/*\[\]}{|_])\1*""")
_NEWLINE = re.compile(r"\s*\n\s*")
# The released `[^\S\n]+` → " " rewrites every single space with itself; matching only runs of two or more and
# lone non-space whitespace gives the same text with far fewer substitutions.
_SPACES = re.compile(r"[^\S\n]{2,}|[^\S\n ]")
_CHAR_MAP = str.maketrans({"—": "-", "–": "-", "―": "-", "…": "...", "´": "'"})


def standardize(text: str) -> str:
    """The released ``text_standardize``: unify dashes/ellipsis/acute, pad punctuation runs, normalise spaces."""
    text = text.translate(_CHAR_MAP)
    text = _PUNCT.sub(r" \g<0> ", text)
    text = _NEWLINE.sub(" \n ", text)
    text = _SPACES.sub(" ", text)
    return text.strip()


# ftfy's own default configuration (what ``ftfy.fix_text(text)`` builds), and the same after a "<" was seen.
_FTFY = ftfy.TextFixerConfig(explain=False)
_FTFY_NO_HTML = _FTFY._replace(unescape_html=False)
# A line ftfy provably leaves alone: printable ASCII and tabs, no "&" (HTML entities), ending in "\n", "\r\n"
# (which ftfy turns into "\n") or nothing. Every ftfy fixer is the identity on such a line: mojibake, quotes,
# ligatures, widths, C1 and surrogates need non-ASCII; escapes and removed controls need bytes below 0x20.
_PLAIN_LINE = re.compile(r"[\t\x20-\x25\x27-\x7e]*(\r?\n)?")


def fix(text: str, html_seen: bool = False) -> str:
    """``ftfy.fix_text`` with its defaults, as the released code calls it (same output, faster on plain lines).

    This is ``ftfy.fix_text``'s own loop (one segment per line) with a shortcut: plain ASCII segments (see
    ``_PLAIN_LINE``) skip the fixers they could not trigger; tests compare with ``ftfy.fix_text`` on real books.
    ``html_seen=True`` says a ``<`` occurred *before* this text in the same document (ftfy stops unescaping HTML
    entities once it has seen one), so a document cut into chunks at line breaks is fixed exactly as if whole.
    """
    config = _FTFY_NO_HTML if html_seen else _FTFY
    out: list[str] = []
    pos, n, limit = 0, len(text), config.max_decode_length
    while pos < n:
        brk = text.find("\n", pos) + 1
        if brk == 0:
            brk = n
        if brk - pos > limit:
            brk = pos + limit
        segment = text[pos:brk]
        if config.unescape_html == "auto" and "<" in segment:
            config = _FTFY_NO_HTML
        plain = _PLAIN_LINE.fullmatch(segment)
        if plain is None:
            out.append(ftfy.fix_and_explain(segment, config).text)
        elif plain.group(1) == "\r\n":
            out.append(segment[:-2] + "\n")
        else:
            out.append(segment)
        pos = brk
    return "".join(out)


def clean(text: str, html_seen: bool = False) -> str:
    """ftfy, then the released standardization."""
    return standardize(fix(text, html_seen))


@lru_cache(maxsize=1)
def spacy_tokenizer():
    """spaCy's rule-based English tokenizer (no tagger/parser/NER, nothing to download)."""
    import spacy

    return spacy.blank("en").tokenizer


def words(text: str) -> list[str]:
    """spaCy word tokens of already-cleaned text (newline tokens included, as the released code keeps them)."""
    return [t.text for t in spacy_tokenizer()(text)]


def word_lines(text: str, cased: bool = False, html_seen: bool = False) -> list[str]:
    """Raw text → the lines the BPE sees: clean, spaCy words (lowercased unless ``cased``) joined by one space.

    Each newline token of the released pipeline ends a line (the tokenizer encodes it as its own id); lines
    without words are dropped, so runs of newlines give one line break, as the released standardization does.
    Joining words with single spaces keeps spaCy's word boundaries: the BPE never merges across a space.
    """
    lines: list[str] = []
    current: list[str] = []
    for tok in spacy_tokenizer()(clean(text, html_seen)):
        w = tok.text
        if tok.is_space:  # standardize leaves only " \n " runs here; spaCy keeps them as tokens
            if "\n" in w and current:
                lines.append(" ".join(current))
                current = []
            continue
        current.append(w)
    if current:
        lines.append(" ".join(current))
    return lines if cased else [line.lower() for line in lines]


# Project Gutenberg markers, e.g. "*** START OF THE PROJECT GUTENBERG EBOOK CARMILLA ***" (and older variants).
_PG_START = re.compile(
    r"^\W*\*{3}\s*START OF (?:THE|THIS) PROJECT GUTENBERG E-?(?:BOOK|TEXT).*$"
    r"|^\*END\*THE SMALL PRINT!.*$",
    re.IGNORECASE | re.MULTILINE,
)
_PG_END = re.compile(
    r"^\W*\*{3}\s*END OF (?:THE|THIS) PROJECT GUTENBERG E-?(?:BOOK|TEXT).*$"
    r"|^\s*End of (?:the )?Project Gutenberg'?s? .*$",
    re.IGNORECASE | re.MULTILINE,
)


def strip_gutenberg(text: str) -> tuple[str, bool]:
    """Keep only the text between the Project Gutenberg start and end markers.

    Returns ``(text, found)``; when no start marker is found the text is returned unchanged with ``found=False``.
    A missing end marker keeps everything after the start marker.
    """
    start = _PG_START.search(text)
    if start is None:
        return text, False
    body_start = start.end()
    end = _PG_END.search(text, body_start)
    return text[body_start : end.start() if end else len(text)], True
