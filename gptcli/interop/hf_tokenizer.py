"""gpt1's tokenizers as Hugging Face ``tokenizer.json`` files that ``AutoTokenizer`` loads without remote code.

A ``tokenizer.json`` chains a normalizer, a pre-tokenizer, a BPE model and a decoder, all built into the
``tokenizers`` library; gpt1's pipeline (:mod:`gptcli.tokenizers.text`) is ftfy, the released standardisation,
spaCy's rule tokenizer and lowercasing before the BPE. :func:`tokenizer_json` builds the closest faithful
construction, stage by stage: the standardisation, lowercasing and the BPE exactly, ftfy and spaCy by the rules
that fire on standardised English text, so that an exported model is usable without gpt1 installed.
``docs/convert.md`` gives the share of texts whose ids are identical.

Nothing here imports ``tokenizers`` or ``transformers``: the file is written as JSON (tests load it with
``transformers.AutoTokenizer``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gptcli.errors import GPT1Error
from gptcli.tokenizers.base import SPECIAL_TOKENS

EXPORTABLE = ("openai", "sentencepiece")
"""Tokenizer kinds :func:`write_hf_tokenizer` can express."""
HF_TOKENIZER = "tokenizer.json"
NEWLINE = "\n"
UNK_SURFACE = "\u2047"  # "⁇", sentencepiece's rendering of its unknown piece (tokenizers/learned.py)
PRE_TOKENIZER = {
    "type": "Sequence",
    "pretokenizers": [
        {"type": "Split", "pattern": {"String": " "}, "behavior": "Removed", "invert": False},
        {"type": "Split", "pattern": {"String": NEWLINE}, "behavior": "Isolated", "invert": False},
    ],
}
"""Words at single spaces (the normalizer leaves no other), each line break a word of its own (the newline id)."""
WORD_END = "\u2581"  # sentencepiece's "▁"

_STANDARD_PUNCT = '-~!";?+,)(/*[]}{|_'  # the released standardisation pads runs of these (tokenizers/text.py)
_CHAR_MAP = (("—", "-"), ("–", "-"), ("―", "-"), ("…", "..."), ("´", "'"))
# ftfy's default fixes that are plain character maps: curly quotes, Latin ligatures, line breaks.
_FTFY_MAP = (
    tuple((c, '"') for c in "“”„‟")
    + tuple((c, "'") for c in "‘’‚‛")
    + (("ﬀ", "ff"), ("ﬁ", "fi"), ("ﬂ", "fl"), ("ﬃ", "ffi"), ("ﬄ", "ffl"), ("ﬅ", "ſt"), ("ﬆ", "st"))
    + (("\r\n", "\n"), ("\r", "\n"), ("\u2028", "\n"), ("\u2029", "\n"), ("\x85", "\n"))
)
# Words spaCy's exception table keeps whole with their final period (the common ones in English prose).
_ABBREVIATIONS = (
    "mr",
    "mrs",
    "ms",
    "dr",
    "st",
    "jr",
    "sr",
    "vs",
    "inc",
    "co",
    "ltd",
    "corp",
    "bros",
    "mt",
    "gen",
    "gov",
    "rev",
    "prof",
    "capt",
    "col",
    "lt",
    "sen",
    "rep",
    "jan",
    "feb",
    "aug",
    "sep",
    "sept",
    "oct",
    "nov",
    "dec",
    "adm",
    "messrs",
)
_PRONOUNS = ("i", "you", "he", "she", "it", "we", "they", "that", "there", "who", "what", "where", "how", "here")
_UNITS = (
    "km",
    "m",
    "dm",
    "cm",
    "mm",
    "ha",
    "nm",
    "yd",
    "ft",
    "kg",
    "g",
    "mg",
    "lb",
    "lbs",
    "oz",
    "mph",
    "mb",
    "kb",
    "gb",
    "tb",
    "k",
)

# Where spaCy's English rules split a standardised word, as zero-width patterns (Oniguruma, the engine of
# tokenizers: ``^``/``$`` match at line ends, ``\z`` at the end of the text). Case-insensitive.
_END = r"(?:\s|$)"
# A clitic's end: the end of a word, or a final period, ellipsis or colon (which spaCy splits off first, then the
# clitic: "wasn't." is was|n't|., "Caroline's." caroline|'s|.), a closing quote allowed after the period.
_CLITIC_END = rf"(?:\.\.\.|\.'?|:)?{_END}"
_SPACY_SPLITS = (
    rf"(?<=\p{{L}})(?=n't{_CLITIC_END})",
    r"(?<=\bcan)(?=not\b)",  # do|n't, ca|n't, can|not
    rf"(?<=[\p{{L}}\p{{N}}])(?='s{_CLITIC_END})",  # it|'s, john|'s
    *(rf"(?<=\b{w})(?='(?:m|d|ll|re|ve){_CLITIC_END})" for w in _PRONOUNS),  # i|'m, they|'ll (spaCy's exceptions)
    rf"(?<=[^\s'])(?='{_CLITIC_END})",  # dogs|'
    rf"(?<=(?:^|\s)')(?!(?:s|(?-i:d|ll|re|em|cause|bout)){_END})(?=[^\s'])",  # '|hello (spaCy keeps 's 're 'em…)
    r"(?<=[\p{L}\p{N}%'])(?<!\.\p{L})(?<!\b\p{L})"
    + "".join(rf"(?<!\b(?-i:{a.title()}))" for a in _ABBREVIATIONS)
    + rf"(?=\.['\"]?{_END})",  # end|.  (but U.S., e.g., E., Mr. stay whole)
    rf"(?<=\p{{L}}'\p{{L}})(?=\.['\"]?{_END})",  # n't|.  's|.  'm|.  (a one-letter clitic is no initial)
    r"(?<=[^.\s])(?=\.\.\.)",
    r"(?<=\.\.\.)(?=[^.\s])",  # wait|...|what
    rf"(?<=\S)(?=:{_END})",
    r"(?<=\p{L})(?=:\p{L})",
    r"(?<=\p{L}:)(?=\p{L})",  # said|:  x|:|y
    r"(?<=(?:^|\s)[$£€#])(?=\S)",  # $|5
    r"(?<=\p{N})(?=%)",
    rf"(?<=\p{{N}})(?=(?:{'|'.join(_UNITS)}){_END})",  # 5|%  40|km
    r"(?<=\S)(?=[<>`=])",
    r"(?<=[<>`=])(?=\S)",  # <|unk|>  `|`  =|2
)


def _regex_replace(pattern: str, content: str) -> dict[str, Any]:
    return {"type": "Replace", "pattern": {"Regex": pattern}, "content": content}


def _standardize_pattern() -> str:
    """Both ends of every run of one standardisation punctuation character (zero-width, inside the text only: the
    ends need no space, and tokenizers 0.23 mis-aligns an insertion at the end of a text that is stripped later)."""
    alts = []
    for c in _STANDARD_PUNCT:
        e = "\\" + c
        alts += [f"(?<=[^{e}])(?={e})", f"(?<={e})(?=[^{e}])"]  # never at the text's ends (see normalizer)
    return "|".join(alts)


def normalizer(cased: bool, word_end: str | None) -> dict[str, Any]:
    """The normalizer: NFC, the standardisation, spaCy's splits as spaces, lowercasing; with ``word_end`` (a
    sentencepiece export) every word and the text then end in it."""
    steps: list[dict[str, Any]] = [{"type": "NFC"}]
    steps += [{"type": "Replace", "pattern": {"String": a}, "content": b} for a, b in _FTFY_MAP + _CHAR_MAP]
    steps += [
        _regex_replace(_standardize_pattern(), " "),
        _regex_replace(r"[^\S\n]*\n\s*", "\n"),
        _regex_replace(r"[^\S\n]+", " "),
        {"type": "Strip", "strip_left": True, "strip_right": True},
    ]
    steps += [_regex_replace("(?i)" + "|".join(_SPACY_SPLITS), " "), _regex_replace(r"[^\S\n]+", " ")]
    if not cased:  # after the splits, as gpt1 lowercases spaCy's words (its exceptions are case-sensitive)
        steps.append({"type": "Lowercase"})
    if word_end:
        steps += [
            {"type": "Replace", "pattern": {"String": " "}, "content": word_end + " "},
            {"type": "Replace", "pattern": {"String": "\n"}, "content": word_end + "\n"},
            _regex_replace(rf"(?<=[^\s{word_end}])\z", word_end),
        ]
    return {"type": "Sequence", "normalizers": steps}


def sentencepiece_merges(pieces: list[str], scores: list[float]) -> list[str]:
    """BPE merges reproducing a sentencepiece BPE model: every split of a piece into two pieces, pieces in descending
    score order (sentencepiece merges the pair whose result scores highest), splits by the ids of their halves."""
    ids = {p: i for i, p in enumerate(pieces)}
    merges: list[tuple[float, int, int, int, str]] = []
    for i, p in enumerate(pieces):
        for k in range(1, len(p)):
            a, b = p[:k], p[k:]
            if a in ids and b in ids:
                merges.append((-scores[i], i, ids[a], ids[b], f"{a} {b}"))
    merges.sort()
    return [m[-1] for m in merges]


def _bpe(vocab: dict[str, int], merges: list[str], unk: str | None, suffix: str | None) -> dict[str, Any]:
    return {
        "type": "BPE",
        "dropout": None,
        "unk_token": unk,
        "continuing_subword_prefix": None,
        "end_of_word_suffix": suffix,
        "fuse_unk": False,
        "byte_fallback": False,
        "ignore_merges": False,
        "vocab": vocab,
        "merges": merges,
    }


def tokenizer_json(tok: Any) -> dict[str, Any]:
    """The ``tokenizer.json`` body for gpt1 tokenizer ``tok`` (kind ``openai`` or ``sentencepiece``).

    Stage by stage:

    - **ftfy** → ``NFC`` (what ftfy's default configuration normalises to) and its fixes that are plain character maps
      (curly quotes, Latin ligatures, line breaks). Mojibake repair, HTML unescaping and the rest have no equivalent;
      text that needs them (rare in clean text) tokenizes differently.
    - **the released standardisation** → exactly: its character map (dashes, ellipsis, acute accent) as ``Replace``
      steps, a space inserted at both ends of every run of its punctuation characters, whitespace collapsed, a line
      break with the spaces around it made one ``\n``.
    - **spaCy** → its rules that fire on standardised English text, as spaces inserted where spaCy splits
      (:data:`_SPACY_SPLITS`): ``n't``, ``'s`` and the pronoun clitics, an apostrophe opening or closing a word, a ``.``
      ending a word (but not an abbreviation of :data:`_ABBREVIATIONS`, one letter or ``U.S.``), ``...``, ``:``,
      currency and ``#`` before a word, ``%`` and units after a number, ``< > =`` and backticks. The rest of its
      exception table and its URL, emoticon and number rules are not reproduced.
    - **lowercasing** → ``Lowercase`` after the splits, as gpt1 lowercases spaCy's words (unless the tokenizer is
      cased).
    - **BPE** → exactly. The original BPE: its vocabulary and merges with ``</w>`` as the end-of-word suffix. A learned
      sentencepiece BPE: its pieces with their ids, merges derived from the pieces in score order (as transformers'
      ``SentencePieceExtractor`` does), and the word-final ``▁`` inserted by the normalizer (sentencepiece's
      whitespace-as-suffix), so that a word ending in a character never merged with ``▁`` still matches. The newline
      is a piece of its own (``\n`` with gpt1's newline id; the pre-tokenizer isolates line breaks). The unknown piece
      is named ``⁇``, not ``<unk>``, so the text ``<unk>`` is tokenized as text (see :func:`tokenizer_json`).
    """
    kind = getattr(tok, "kind", None)
    if kind == "sentencepiece":
        sp = tok.sp
        pieces = [sp.id_to_piece(i) for i in range(tok.n_pieces)]
        scores = [sp.get_score(i) for i in range(tok.n_pieces)]
        # The unknown piece is named by the surface sentencepiece decodes it to ("⁇"), not "<unk>": transformers
        # matches a special token's text before tokenizing, and "<unk>" is text in WikiText (gpt1 splits it up).
        pieces[sp.unk_id()] = UNK_SURFACE
        vocab = {p: i for i, p in enumerate(pieces)}
        vocab[NEWLINE] = tok.newline_id  # a piece of its own: the pre-tokenizer isolates line breaks
        model = _bpe(vocab, sentencepiece_merges(pieces, scores), UNK_SURFACE, None)
        norm, suffix = normalizer(bool(tok.cased), WORD_END), WORD_END
    elif kind == "openai":
        from gptcli.tokenizers.openai import EOW

        vocab = dict(tok.encoder)
        unk = None
        if vocab.get("<unk>") == 0:  # the released vocabulary's id 0, renamed as for sentencepiece (see above)
            del vocab["<unk>"]
            vocab[UNK_SURFACE] = 0
            unk = UNK_SURFACE
        model = _bpe(vocab, [f"{a} {b}" for a, b in tok.merges], unk, EOW)
        norm, suffix = normalizer(False, None), EOW
    else:
        raise GPT1Error(
            f"tokenizer kind {kind!r} cannot be written as a Hugging Face tokenizer (known: {', '.join(EXPORTABLE)})"
        )
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [],
        "normalizer": norm,
        "pre_tokenizer": PRE_TOKENIZER,
        "post_processor": None,
        "decoder": decoder(suffix, newline_spaced=kind == "openai"),
        "model": model,
    }


def decoder(suffix: str, newline_spaced: bool) -> dict[str, Any]:
    """Ids → text as gpt1's ``decode``: each word's end-of-word suffix a space, the last one dropped; for a learned
    BPE no space before or after a line break (the original BPE's ``\\n</w>`` keeps them, as gpt1 does)."""
    steps: list[dict[str, Any]] = [{"type": "Replace", "pattern": {"String": suffix}, "content": " "}, {"type": "Fuse"}]
    if not newline_spaced:
        steps.append({"type": "Replace", "pattern": {"String": " \n"}, "content": "\n"})
    steps.append({"type": "Strip", "content": " ", "start": 0, "stop": 1})
    return {"type": "Sequence", "decoders": steps}


def special_token_ids(tok: Any) -> dict[str, int]:
    """gpt1's fine-tuning tokens (start, delimiter, extract) → their ids (rows of the model after the vocabulary).
    They are not added tokens of the exported tokenizer: ``$`` in text must stay the BPE's ``$``."""
    return dict(zip(SPECIAL_TOKENS, (tok.start_id, tok.delim_id, tok.extract_id)))


def write_hf_tokenizer(directory: Path, tok: Any, n_ctx: int) -> None:
    """``tokenizer.json``, ``tokenizer_config.json`` and ``special_tokens_map.json`` for ``tok`` in ``directory``
    (a fresh temporary directory renamed into place whole, so plain writes suffice). The unknown token is the only
    special token, and the padding token too: GPT-1 has no BOS, EOS or padding token, and batched pipelines of
    transformers refuse to pad without one (padded positions are masked out, so which id pads does not matter)."""
    body = tokenizer_json(tok)
    unk = body["model"]["unk_token"]
    newline = tok.newline_id if tok.kind == "sentencepiece" else tok.encoder.get(NEWLINE + "</w>")
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": n_ctx,
        **({"unk_token": unk, "pad_token": unk} if unk else {}),
        "clean_up_tokenization_spaces": False,
        "gpt1": {
            "kind": tok.kind,
            "cased": bool(getattr(tok, "cased", False)),
            "newline_id": newline,
            "special_tokens": special_token_ids(tok),
        },
    }
    (directory / HF_TOKENIZER).write_text(json.dumps(body, ensure_ascii=False) + "\n", encoding="utf-8")
    (directory / "tokenizer_config.json").write_text(
        json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
    )
    specials = {"unk_token": unk, "pad_token": unk} if unk else {}
    (directory / "special_tokens_map.json").write_text(json.dumps(specials, indent=2) + "\n", encoding="utf-8")


def read_original_bpe(path: Path) -> tuple[dict[str, int], list[tuple[str, str]]] | None:
    """The vocabulary and merges of GPT-1's original BPE from a ``tokenizer.json`` (what transformers 5 saves for
    ``openai-gpt`` in place of ``vocab.json`` + ``merges.txt``, and what :func:`write_hf_tokenizer` writes), or None
    when the file holds another kind of tokenizer. Only the BPE is read: gpt1 applies its own text pipeline, as
    it does with the two files."""
    from gptcli.errors import DataError
    from gptcli.tokenizers.openai import EOW

    try:
        body = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DataError(path, f"unreadable tokenizer file ({e})") from None
    model = body.get("model") if isinstance(body, dict) else None
    if not isinstance(model, dict) or model.get("type") != "BPE" or model.get("end_of_word_suffix") != EOW:
        return None
    vocab, merges = model.get("vocab"), model.get("merges")
    pairs = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in merges or []]
    if (
        not isinstance(vocab, dict)
        or sorted(vocab.values()) != list(range(len(vocab)))
        or any(len(p) != 2 or not all(isinstance(s, str) for s in p) for p in pairs)
    ):
        raise DataError(path, "its BPE vocabulary ids are not exactly 0 … n-1, or a merge is not a pair of symbols")
    if model.get("unk_token") == UNK_SURFACE and vocab.get(UNK_SURFACE) == 0:  # the name our export gives id 0
        vocab = {("<unk>" if t == UNK_SURFACE else t): i for t, i in vocab.items()}
    return vocab, pairs  # type: ignore[return-value]
