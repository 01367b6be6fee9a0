"""Text cleaning and word splitting, exactly as GPT-1's released code does it (reference §1).

``clean`` = ``ftfy.fix_text`` followed by the released ``text_standardize``; ``words`` = spaCy's English
tokenizer (``spacy.blank("en")``: rules only, no model download). Lowercasing and BPE belong to the tokenizer.
"""

from __future__ import annotations

import re
from functools import lru_cache

import ftfy

# The released code writes this pattern in a *non-raw* string, so its `\\+` reaches the regex engine as `\+`
# (a second literal-plus alternative) and backslashes are NOT split. Hugging Face's port uses a raw string and
# does split them. We follow the original; tests pin the backslash case.
_PUNCT = re.compile(r"""(-+|~+|!+|"+|;+|\?+|\++|,+|\)+|\(+|\++|\/+|\*+|\[+|\]+|}+|{+|\|+|_+)""")
_NEWLINE = re.compile(r"\s*\n\s*")
_SPACES = re.compile(r"[^\S\n]+")
_CHAR_MAP = str.maketrans({"—": "-", "–": "-", "―": "-", "…": "...", "´": "'"})


def standardize(text: str) -> str:
    """The released ``text_standardize``: unify dashes/ellipsis/acute, pad punctuation runs, normalise spaces."""
    text = text.translate(_CHAR_MAP)
    text = _PUNCT.sub(r" \1 ", text)
    text = _NEWLINE.sub(" \n ", text)
    text = _SPACES.sub(" ", text)
    return text.strip()


def fix(text: str) -> str:
    """``ftfy.fix_text`` with its defaults, as the released code calls it."""
    return ftfy.fix_text(text)


def clean(text: str) -> str:
    """ftfy, then the released standardization."""
    return standardize(fix(text))


@lru_cache(maxsize=1)
def spacy_tokenizer():
    """spaCy's rule-based English tokenizer (no tagger/parser/NER, nothing to download)."""
    import spacy

    return spacy.blank("en").tokenizer


def words(text: str) -> list[str]:
    """spaCy word tokens of already-cleaned text (newline tokens included, as the released code keeps them)."""
    return [t.text for t in spacy_tokenizer()(text)]
