"""The original GPT-1 tokenizer: known ids, Hugging Face parity, the released code's quirks, files."""

from __future__ import annotations

import csv
import json
import random
import re
from pathlib import Path

import pytest

from gptcli.errors import DataError, GPT1Error
from gptcli.tokenizers import load_tokenizer
from gptcli.tokenizers.openai import OpenAIBPETokenizer

# Ids produced by transformers 4.46.3's OpenAIGPTTokenizer on its spaCy + ftfy path (the last release that has it;
# transformers 5.x replaced it with a BERT pre-tokenizer), from encoder_bpe_40000.json + vocab_40000.bpe. Strings
# are our own, chosen where that path and the released code agree (no backslashes; see the divergence tests).
HF_SPACY_GOLDEN = [
    ("the president is", [481, 4735, 544]),
    (
        "It was a very good movie, and I'd watch it again!",
        [507, 509, 246, 963, 870, 4121, 240, 488, 249, 656, 1832, 507, 833, 267],
    ),
    (
        "“Smart quotes” — and an em-dash… plus ´acute´ accents.",
        [244, 3919, 23919, 244, 260, 488, 531, 3525, 260, 9241, 749, 4733, 256, 17261, 256, 23442, 239],
    ),
    (
        "First line.\n\nSecond line after a blank line.\r\nThird (CRLF) line.",
        [929, 1584, 239, 40477, 1420, 1584, 861, 246, 5252, 1584, 239, 40477, 2981, 276, 1248, 26, 250, 275, 1584, 239],
    ),
    (
        "Numbers: 3.14, 1,000,000 and 42nd; emails a@b.co; URLs http://x.org/a_b.",
        [
            4878,
            271,
            19243,
            7765,
            240,
            277,
            240,
            7397,
            240,
            7397,
            488,
            44,
            22473,
            270,
            15650,
            8,
            67,
            28901,
            3833,
            270,
            543,
            911,
            12739,
            271,
            11240,
            34,
            1,
            31963,
            278,
            246,
            279,
            11512,
        ],
    ),
    ("Café naïve résumé coöperate — façade.", [13550, 24213, 17, 62, 6414, 300, 588, 133, 750, 746, 260, 28409, 239]),
    (
        "He said: \"don't\", she'd've; they're (not) [really] {sure} | maybe ~ok~ _x_ *y* +z+ a/b?!",
        [
            487,
            603,
            271,
            244,
            587,
            538,
            244,
            240,
            520,
            656,
            880,
            270,
            600,
            761,
            276,
            595,
            275,
            293,
            976,
            294,
            309,
            881,
            310,
            323,
            1096,
            283,
            773,
            283,
            279,
            272,
            279,
            269,
            253,
            269,
            306,
            274,
            306,
            246,
            278,
            259,
            257,
            267,
        ],
    ),
    ("Mojibake: donâ€™t worry.", [593, 7823, 19007, 271, 587, 538, 2177, 239]),
    ("Tabs\tand   multiple    spaces   collapse.", [21082, 488, 9163, 12696, 9823, 239]),
    ("日本語 text and emoji 🙂 become unknowns.", [0, 0, 0, 4830, 488, 2241, 8117, 0, 2150, 38764, 239]),
]


@pytest.fixture(scope="module")
def bpe_dir(shared_data: Path) -> Path:
    return shared_data / "openai-gpt-bpe"


@pytest.fixture(scope="module")
def tok(bpe_dir: Path) -> OpenAIBPETokenizer:
    return OpenAIBPETokenizer.from_dir(bpe_dir)


# ------------------------------------------------------------------------------------------ reference
class ReleasedTextEncoder:
    """A literal transcription of the released ``text_utils.TextEncoder`` (spaCy's blank English tokenizer in
    place of ``spacy.load('en')``, whose tokenizer rules are the same). Kept deliberately unoptimised and
    independent of ``gptcli`` so the fast implementation is checked against the original algorithm."""

    def __init__(self, encoder_path: Path, bpe_path: Path) -> None:
        import ftfy
        import spacy

        self.fix = ftfy.fix_text
        self.nlp = spacy.blank("en")
        self.encoder = json.load(open(encoder_path, encoding="utf-8"))
        merges = open(bpe_path, encoding="utf-8").read().split("\n")[1:-1]
        self.bpe_ranks = dict(zip([tuple(m.split()) for m in merges], range(len(merges))))

    @staticmethod
    def standardize(text: str) -> str:
        text = text.replace("—", "-").replace("–", "-").replace("―", "-").replace("…", "...").replace("´", "'")
        # The released source writes this pattern in a non-raw string; "\\\\+" there is the *value* "\\+", which
        # re reads as a second literal plus, so backslashes are not split. (Written here with each backslash
        # doubled so the string value is identical.)
        text = re.sub(
            """(-+|~+|!+|"+|;+|\\?+|\\++|,+|\\)+|\\(+|\\+|\\/+|\\*+|\\[+|\\]+|}+|{+|\\|+|_+)""", r" \1 ", text
        )
        text = re.sub("\\s*\\n\\s*", " \n ", text)
        text = re.sub("[^\\S\\n]+", " ", text)
        return text.strip()

    def bpe(self, token: str) -> str:
        word = tuple(token[:-1]) + (token[-1] + "</w>",)
        pairs = {(a, b) for a, b in zip(word, word[1:])}
        if not pairs:
            return token + "</w>"
        while True:
            bigram = min(pairs, key=lambda p: self.bpe_ranks.get(p, float("inf")))
            if bigram not in self.bpe_ranks:
                break
            first, second = bigram
            new_word, i = [], 0
            while i < len(word):
                try:
                    j = word.index(first, i)
                    new_word.extend(word[i:j])
                    i = j
                except ValueError:
                    new_word.extend(word[i:])
                    break
                if word[i] == first and i < len(word) - 1 and word[i + 1] == second:
                    new_word.append(first + second)
                    i += 2
                else:
                    new_word.append(word[i])
                    i += 1
            word = tuple(new_word)
            if len(word) == 1:
                break
            pairs = {(a, b) for a, b in zip(word, word[1:])}
        word = " ".join(word)
        return "\n</w>" if word == "\n  </w>" else word

    def encode(self, text: str) -> list[int]:
        out = []
        for t in self.nlp(self.standardize(self.fix(text))):
            out.extend(self.encoder.get(p, 0) for p in self.bpe(t.text.lower()).split(" "))
        return out


def _tsv_column(path: Path, column, header: bool = True, limit: int | None = None) -> list[str]:
    with open(path, encoding="utf-8-sig", newline="") as f:
        rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    if header:
        idx, rows = rows[0].index(column), rows[1:]
    else:
        idx = column
    return [r[idx] for r in rows if len(r) > idx][:limit]


@pytest.fixture(scope="module")
def real_sentences(shared_data: Path) -> list[str]:
    """~3,000 real texts: GLUE sentences, Story Cloze stories, paragraphs of books (with newlines, CRLF, BOM)."""
    g = shared_data / "glue"
    s = _tsv_column(g / "SST-2/dev.tsv", "sentence")
    s += _tsv_column(g / "CoLA/dev.tsv", 3, header=False)
    s += _tsv_column(g / "RTE/dev.tsv", "sentence1")
    s += _tsv_column(g / "MRPC/dev.tsv", "#1 String", limit=300)
    s += _tsv_column(g / "STS-B/dev.tsv", "sentence1", limit=200)
    story = next((shared_data / "storycloze").glob("*.csv"))
    with open(story, encoding="utf-8", newline="") as f:
        for r in list(csv.DictReader(f))[:200]:
            s.append(" ".join(r[f"InputSentence{i}"] for i in range(1, 5)) + " " + r["RandomFifthSentenceQuiz1"])
    for book in sorted((shared_data / "books").glob("*.txt"))[:8]:
        paras = book.read_bytes().decode("utf-8").split("\r\n\r\n")  # keep CRLF and the BOM inside the text
        s += random.Random(book.name).sample(paras, min(40, len(paras)))
    return s


# ------------------------------------------------------------------------------------------------ tests
def test_known_ids(tok: OpenAIBPETokenizer) -> None:
    assert tok.vocab_size == 40478
    for word, i in [("the", 481), ("very", 963), ("positive", 6353), ("negative", 9503)]:
        assert tok.encode(word) == [i]
        assert tok.token_to_id(word + "</w>") == i
    assert tok.encode("The President is") == [481, 4735, 544]
    assert tok.token_to_id("<unk>") == 0 and tok.token_to_id("\n</w>") == 40477


def test_special_tokens_follow_the_vocabulary(tok: OpenAIBPETokenizer) -> None:
    assert (tok.start_id, tok.delim_id, tok.extract_id, tok.total_vocab) == (40478, 40479, 40480, 40481)
    assert [tok.id_to_token(i) for i in (40478, 40479, 40480)] == ["<s>", "$", "<e>"]
    assert tok.token_to_id("<s>") == 40478 and tok.token_to_id("<e>") == 40480
    with pytest.raises(IndexError):
        tok.id_to_token(40481)


@pytest.mark.parametrize("text,ids", HF_SPACY_GOLDEN)
def test_matches_hf_spacy_path_golden(tok: OpenAIBPETokenizer, text: str, ids: list[int]) -> None:
    assert tok.encode(text) == ids


def test_matches_released_code_on_real_text(tok: OpenAIBPETokenizer, bpe_dir: Path, real_sentences: list[str]) -> None:
    ref = ReleasedTextEncoder(bpe_dir / "encoder_bpe_40000.json", bpe_dir / "vocab_40000.bpe")
    assert len(real_sentences) > 2500
    texts = real_sentences + ["C:\\Users\\me and a\\\\b", 'escaped \\n newline \\"quote\\"', "x \\+ y"]
    mismatches = [s for s in texts if tok.encode(s) != ref.encode(s)]
    assert not mismatches, f"{len(mismatches)} texts differ, e.g. {mismatches[0][:200]!r}"
    assert tok.encode_batch(real_sentences[:300]) == [ref.encode(s) for s in real_sentences[:300]]
    assert sum(40477 in tok.encode(s) for s in real_sentences) > 50  # the newline special case is exercised


def test_matches_installed_transformers(tok: OpenAIBPETokenizer, real_sentences: list[str], tmp_path: Path) -> None:
    """Against whatever ``OpenAIGPTTokenizer`` is installed, on its own terms.

    transformers ≤ 4.x with spaCy + ftfy: the full pipeline. That path lowercases the text *before* spaCy (the
    released code lowercases spaCy's tokens), which changes spaCy's abbreviation exceptions (``Mrs.``), so each text
    must equal ours either as is or lowercased first. transformers 5.x has no spaCy path (a BERT pre-tokenizer in
    Rust): its BPE and vocabulary are still the original ones, so every purely alphanumeric word must match.
    """
    transformers = pytest.importorskip("transformers")
    texts = [s for s in real_sentences if "\\" not in s]  # HF splits backslashes, the original does not
    if int(transformers.__version__.split(".")[0]) < 5:  # pragma: no cover - only with transformers 4.x
        tok.save_bpe_files(tmp_path)
        hf = transformers.OpenAIGPTTokenizer(str(tmp_path / "vocab.json"), str(tmp_path / "merges.txt"))
        assert hf.fix_text is not None, "spacy/ftfy not importable: transformers fell back to BasicTokenizer"
        bad = [s for s in texts if hf.encode(s) not in (tok.encode(s), tok.encode(s.lower()))]
        assert not bad, f"{len(bad)} texts differ, e.g. {bad[0][:200]!r}"
        return
    hf = transformers.OpenAIGPTTokenizer(vocab=dict(tok.encoder), merges=list(tok.merges))
    assert not hasattr(hf, "nlp"), "transformers 5.x unexpectedly has a spaCy path: compare full texts instead"
    words = sorted({w for s in texts[:1500] for w in re.findall(r"[A-Za-z0-9]+", s)})
    assert len(words) > 3000
    bad = [w for w in words if hf.encode(w, add_special_tokens=False) != list(tok.word_ids(w))]
    assert not bad, f"{len(bad)} words differ, e.g. {bad[:5]}"


def test_lowercase_before_spacy_divergence_is_pinned(tok: OpenAIBPETokenizer) -> None:
    # The released code runs spaCy on cased text: "Mrs." / "Dr." / "St." / "U.S." stay single tokens.
    text = "Mrs. Smith met Dr. Jones in St. Louis, U.S."
    assert tok.encode(text) == [2563, 4920, 1665, 2863, 7984, 500, 6165, 7705, 240, 9901]
    # transformers 4.46.3 (spaCy path) lowercased first and got these; that equals ours on the lowercased text.
    hf4 = [8417, 239, 4920, 1665, 11164, 239, 7984, 500, 523, 239, 7705, 240, 25896, 252, 239]
    assert tok.encode(text.lower()) == hf4


def test_backslashes_are_not_split(tok: OpenAIBPETokenizer) -> None:
    text = "a path C:\\dir\\file and a\\\\b"
    ids = tok.encode(text)
    assert [tok.id_to_token(i) for i in ids] == [
        "a</w>",
        "path</w>",
        "c",
        ":",
        "\\",
        "dir",
        "\\",
        "file</w>",
        "and</w>",
        "a",
        "\\",
        "\\",
        "b</w>",
    ]
    # transformers 4.46.3 (raw-string regex) pads backslashes with spaces and so gets different ids:
    assert ids != [246, 2757, 263, 271, 365, 24711, 365, 4135, 488, 246, 127, 365, 259]


def test_newline_token_special_case(tok: OpenAIBPETokenizer) -> None:
    assert tok.bpe("\n ") == "\n</w>"  # spaCy's newline token: '\n  </w>' in the raw BPE output
    assert tok.encode("one\n\n\ntwo") == [tok.encode("one")[0], 40477, tok.encode("two")[0]]


def test_decode(tok: OpenAIBPETokenizer) -> None:
    ids = tok.encode("The president is very positive.")
    assert tok.decode(ids) == "the president is very positive ."
    assert tok.decode([481, 40478, 40480]) == "the <s> <e>"


def test_save_load_roundtrip_and_dispatch(tok: OpenAIBPETokenizer, tmp_path: Path) -> None:
    tok.save(tmp_path / "t")
    meta = json.loads((tmp_path / "t" / "tokenizer.json").read_text())
    assert meta["kind"] == "openai"
    assert {p.name for p in (tmp_path / "t").iterdir()} == {"tokenizer.json", "vocab.json", "merges.txt"}
    again = load_tokenizer(tmp_path / "t")
    assert isinstance(again, OpenAIBPETokenizer)
    assert again.encoder == tok.encoder and again.merges == tok.merges
    text = "Hello there, General Kenobi!\nYou are a bold one."
    assert again.encode(text) == tok.encode(text)


def test_accepts_both_file_names(bpe_dir: Path, tmp_path: Path) -> None:
    (tmp_path / "vocab.json").write_bytes((bpe_dir / "encoder_bpe_40000.json").read_bytes())
    (tmp_path / "merges.txt").write_bytes((bpe_dir / "vocab_40000.bpe").read_bytes())
    a, b = OpenAIBPETokenizer.from_dir(tmp_path), OpenAIBPETokenizer.from_dir(bpe_dir)
    assert a.encoder == b.encoder and a.merges == b.merges and len(a.merges) == 40000


def test_bad_files_are_reported(tmp_path: Path) -> None:
    with pytest.raises(GPT1Error, match="no OpenAI BPE files"):
        OpenAIBPETokenizer.from_dir(tmp_path)
    (tmp_path / "vocab.json").write_text('{"a</w>": 0, "b</w>": 1}')
    (tmp_path / "merges.txt").write_text("#version: 0.2\na b\nbroken-line\n")
    with pytest.raises(DataError, match=r"merges\.txt:3: expected two symbols"):
        OpenAIBPETokenizer.from_dir(tmp_path)
    (tmp_path / "vocab.json").write_text('{"a</w>": 0, "b</w>": 5}')
    with pytest.raises(DataError, match="0 … n-1"):
        OpenAIBPETokenizer.from_dir(tmp_path)


def test_tiny_vocabulary_without_shared_data(tmp_path: Path) -> None:
    """The BPE mechanics on a hand-made vocabulary (runs even without ../shared)."""
    vocab = {"<unk>": 0, "l": 1, "o": 2, "w": 3, "lo": 4, "low</w>": 5, "o</w>": 6, "w</w>": 7, "l</w>": 8}
    tok = OpenAIBPETokenizer(vocab, [("l", "o"), ("lo", "w</w>")])
    assert tok.bpe("low") == "low</w>" and tok.bpe("lol") == "lo l</w>" and tok.bpe("wow") == "w o w</w>"
    assert tok.encode("LOW low Lol wow xyz") == [5, 5, 4, 8, 3, 2, 7, 0, 0, 0]


# ------------------------------------------------------------------------------- encode_lines (gpt1 prepare)
def test_encode_lines_of_word_lines_is_encode(tok: OpenAIBPETokenizer, real_sentences: list[str]) -> None:
    """The rule docs/prepare.md states: ``encode_lines(word_lines(text)) == encode(text)`` for every text, so a
    corpus prepared with this tokenizer holds the released ``TextEncoder.encode`` ids of its documents."""
    import numpy as np

    from gptcli.tokenizers.text import word_lines

    tricky = list("ab Σ'\n\r\t .,-") + [
        "\u2028",
        "\u00a0",
        "\u3000",
        "\u200b",
        "\ufeff",
        "\x0b",
        "\x0c",
        "\x85",
        "İ",
        "ΟΣ",
        "&amp;",
        "<",
        "  ",
        "\n\n",
        "\r\n",
        "\u202f",
        "\u2000",
        "日",
    ]
    rng = random.Random(0)
    texts = real_sentences + ["".join(rng.choice(tricky) for _ in range(rng.randint(0, 30))) for _ in range(2000)]
    bad = [t for t in texts if tok.encode_lines(word_lines(t)).tolist() != tok.encode(t)]
    assert not bad, f"{len(bad)} texts differ, e.g. {bad[0][:200]!r}"
    ids = tok.encode_lines(["the president", "is"])
    assert ids.dtype == np.uint16 and ids.tolist() == [481, 4735, 40477, 544]  # the newline id between lines only
    assert tok.newline_id == 40477 and tok.encode_lines([]).tolist() == [] and tok.encode_lines([""]).tolist() == []
    assert tok.cased is False


def test_encode_lines_without_a_newline_token(tmp_path: Path) -> None:
    """A vocabulary without ``\\n</w>``: a line break is ``<unk>``, in ``encode`` and ``encode_lines`` alike."""
    vocab = {"<unk>": 0, "l": 1, "o": 2, "w": 3, "lo": 4, "low</w>": 5, "o</w>": 6, "w</w>": 7, "l</w>": 8}
    tok = OpenAIBPETokenizer(vocab, [("l", "o"), ("lo", "w</w>")])
    assert tok.newline_id == 0
    assert tok.encode_lines(["low lol", "wow"]).tolist() == tok.encode("LOW lol\n\nwow") == [5, 4, 8, 0, 3, 2, 7]
