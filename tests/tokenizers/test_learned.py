"""The learned sentencepiece BPE tokenizer: ids, round trips, specials, persistence, determinism."""

from __future__ import annotations

import json

import pytest

from gptcli.errors import GPT1Error
from gptcli.tokenizers import SPECIAL_TOKENS, load_tokenizer
from gptcli.tokenizers.learned import LearnedBPETokenizer, training_pieces
from gptcli.tokenizers.text import strip_gutenberg, word_lines


@pytest.fixture(scope="module")
def book(shared_data) -> str:
    raw = (shared_data / "books" / "pg11_alice_in_wonderland.txt").read_text(encoding="utf-8-sig")
    return strip_gutenberg(raw)[0]


@pytest.fixture(scope="module")
def tok(book) -> LearnedBPETokenizer:
    return LearnedBPETokenizer.train(word_lines(book), vocab_size=500, seed=0)


def test_vocab_layout(tok):
    assert tok.vocab_size == 500
    assert tok.total_vocab == 503
    assert tok.id_to_token(0) == "<unk>"
    assert tok.newline_id == 499 and tok.id_to_token(499) == "\n"
    assert (tok.start_id, tok.delim_id, tok.extract_id) == (500, 501, 502)
    assert [tok.id_to_token(i) for i in (500, 501, 502)] == list(SPECIAL_TOKENS)
    # lowercased pipeline: no uppercase letters in the vocabulary; words end with the suffix marker
    pieces = [tok.id_to_token(i) for i in range(1, tok.newline_id)]
    assert not any(p != p.lower() for p in pieces)
    assert tok.token_to_id("the▁") is not None


def test_round_trip_on_a_book(tok, book):
    ids = tok.encode(book)
    assert max(ids) < tok.vocab_size
    assert tok.decode(ids) == "\n".join(word_lines(book))
    assert 0 not in ids  # every character of the training text is covered


def test_encode_details(tok):
    ids = tok.encode("Alice said: 'Hello!'\n\nThe end.")
    assert ids.count(tok.newline_id) == 1
    assert tok.decode(ids) == "alice said : ' hello ! '\nthe end ."
    assert tok.encode("") == []
    assert tok.encode_batch(["The Queen", "", "a\nb"]) == [tok.encode("The Queen"), [], tok.encode("a\nb")]
    # a character never seen in training maps to <unk> (id 0), like the original vocabulary
    assert 0 in tok.encode("ж")
    with_specials = [tok.start_id] + tok.encode("hi there") + [tok.delim_id] + tok.encode("bye") + [tok.extract_id]
    assert tok.decode(with_specials) == "<s> hi there $ bye <e>"


def test_token_id_maps_are_inverse(tok):
    for i in range(tok.total_vocab):
        assert tok.token_to_id(tok.id_to_token(i)) == i
    assert tok.token_to_id("definitely-not-a-piece") is None
    with pytest.raises(IndexError):
        tok.id_to_token(tok.total_vocab)


def test_save_load(tok, tmp_path, book):
    tok.save(tmp_path / "t")
    meta = json.loads((tmp_path / "t" / "tokenizer.json").read_text())
    assert meta["kind"] == "sentencepiece" and meta["vocab_size"] == 500 and meta["cased"] is False
    again = load_tokenizer(tmp_path / "t")
    assert isinstance(again, LearnedBPETokenizer)
    assert again.encode(book[:5000]) == tok.encode(book[:5000])


def test_training_is_deterministic_and_cased_option(book):
    lines = word_lines(book[:60000])
    a = LearnedBPETokenizer.train(lines, vocab_size=300, seed=3)
    b = LearnedBPETokenizer.train(lines, vocab_size=300, seed=3)
    assert a._proto == b._proto
    cased = LearnedBPETokenizer.train(word_lines(book[:60000], cased=True), vocab_size=300, cased=True)
    assert cased.decode(cased.encode("Alice")) == "Alice"


def test_long_lines_are_not_dropped():
    # sentencepiece silently skips sentences over max_sentence_length; we cut them at spaces instead.
    long_line = " ".join(["zyxwv"] * 3000)  # 18 kB, the only place "zyxwv" occurs
    pieces = training_pieces(long_line)
    assert len(pieces) > 1 and " ".join(pieces) == long_line
    assert all(len(p.encode()) <= 4096 for p in pieces)
    lines = ["the cat sat on the mat", "a dog ran", long_line]
    tok = LearnedBPETokenizer.train(lines * 3, vocab_size=55)
    assert tok.token_to_id("zyxwv▁") is not None
    assert tok.encode("zyxwv") == [tok.token_to_id("zyxwv▁")]


def test_impossible_vocab_size_is_a_user_error():
    with pytest.raises(GPT1Error, match="lower --vocab-size"):
        LearnedBPETokenizer.train(["a b c", "d e f"] * 10, vocab_size=5000)
