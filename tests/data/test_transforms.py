"""The paper's input transformations: exact token layouts and truncation rules (reference §4)."""

from __future__ import annotations

import itertools

import pytest
from toy_tokenizer import ToyTokenizer

from gptcli.data.transforms import (
    SpecialIds,
    encode_examples,
    multiple_choice,
    released_roc_max_len,
    transform_ids,
    truncate_pair,
)
from gptcli.tasks.base import Example, Task

S, D, E = 1000, 1001, 1002
SP = SpecialIds(S, D, E)


def _task(kind: str, n_choices: int = 0, labels=("0", "1")) -> Task:
    return Task(
        name=f"toy-{kind}",
        title="toy",
        kind=kind,
        labels=labels,
        metric="accuracy",
        folder="toy",
        splits={},
        n_choices=n_choices,
    )


def test_classification_layout():
    assert transform_ids("classification", [[5, 6, 7]], [], SP, 512) == [[S, 5, 6, 7, E]]


def test_entailment_layout():
    assert transform_ids("entailment", [[5, 6], [7, 8, 9]], [], SP, 512) == [[S, 5, 6, D, 7, 8, 9, E]]


@pytest.mark.parametrize("kind", ["similarity", "regression"])
def test_similarity_both_orders(kind):
    seqs = transform_ids(kind, [[5, 6], [7, 8, 9]], [], SP, 512)
    assert seqs == [[S, 5, 6, D, 7, 8, 9, E], [S, 7, 8, 9, D, 5, 6, E]]


def test_multiple_choice_one_sequence_per_answer_race_style():
    seqs = transform_ids("multiple_choice", [[10, 11, 12], [20, 21]], [[30], [31, 32], [33], [34]], SP, 512)
    assert seqs == [
        [S, 10, 11, 12, 20, 21, D, 30, E],
        [S, 10, 11, 12, 20, 21, D, 31, 32, E],
        [S, 10, 11, 12, 20, 21, D, 33, E],
        [S, 10, 11, 12, 20, 21, D, 34, E],
    ]


def test_multiple_choice_story_cloze_style():
    seqs = transform_ids("multiple_choice", [[10, 11]], [[30], [31, 32]], SP, 512)
    assert seqs == [[S, 10, 11, D, 30, E], [S, 10, 11, D, 31, 32, E]]


# --------------------------------------------------------------------------------------------- truncation


def _pair_loop(a, b, budget):
    """The usual loop (BERT's _truncate_seq_pair): pop from the longer, from ``b`` on ties."""
    a, b = list(a), list(b)
    while len(a) + len(b) > budget:
        if len(a) > len(b):
            a.pop()
        else:
            b.pop()
    return a, b


def test_truncate_pair_matches_the_loop_exhaustively():
    for la, lb, budget in itertools.product(range(0, 13), range(0, 13), range(0, 14)):
        a, b = list(range(la)), list(range(100, 100 + lb))
        assert truncate_pair(a, b, budget) == _pair_loop(a, b, budget), (la, lb, budget)


def test_classification_truncation_keeps_head_and_fits():
    n_ctx = 16
    seq = transform_ids("classification", [list(range(100))], [], SP, n_ctx)[0]
    assert len(seq) == n_ctx and seq[0] == S and seq[-1] == E and seq[1:-1] == list(range(14))
    # Exactly fitting text is untouched.
    assert transform_ids("classification", [list(range(14))], [], SP, n_ctx)[0][1:-1] == list(range(14))


def test_pair_truncation_cuts_the_longer_field_first():
    n_ctx = 20  # budget 17
    long, short = list(range(100, 130)), [1, 2, 3]
    seq = transform_ids("entailment", [long, short], [], SP, n_ctx)[0]
    assert len(seq) == n_ctx
    assert seq == [S, *range(100, 114), D, 1, 2, 3, E]
    # Both long: split evenly (the first field gets the odd token).
    seq = transform_ids("entailment", [list(range(100, 130)), list(range(200, 230))], [], SP, n_ctx)[0]
    assert seq == [S, *range(100, 109), D, *range(200, 208), E]


def test_similarity_orders_share_the_cut():
    a, b = list(range(100, 140)), list(range(200, 210))
    s1, s2 = transform_ids("similarity", [a, b], [], SP, 24)
    assert len(s1) == len(s2) == 24
    assert s1[1 : s1.index(D)] == s2[s2.index(D) + 1 : -1]
    assert s2[1 : s2.index(D)] == s1[s1.index(D) + 1 : -1] == b


def test_story_cloze_truncation_is_the_released_one():
    # Released transform_roc: x1[:max_len], x2[:max_len] with max_len = n_ctx // 2 - 2.
    assert released_roc_max_len(512) == 254
    story, e1, e2 = list(range(1000)), list(range(2000, 2300)), [7, 8]
    seqs = multiple_choice(story, None, [e1, e2], SP, 512)
    assert seqs[0] == [S, *story[:254], D, *e1[:254], E] and len(seqs[0]) == 511
    assert seqs[1] == [S, *story[:254], D, 7, 8, E]
    for n_ctx in (16, 17, 31, 512, 513):
        for s in multiple_choice(story, None, [e1, e2], SP, n_ctx):
            assert len(s) <= n_ctx


def test_race_truncation_keeps_question_and_answers_whole():
    n_ctx = 32  # budget 29
    article, question = list(range(100, 200)), [1, 2, 3, 4, 5]
    answers = [[10], [11, 12, 13], [14, 15], [16]]
    seqs = multiple_choice(article, question, answers, SP, n_ctx)
    room = 29 - 5 - 3
    for s, ans in zip(seqs, answers):
        assert s == [S, *article[:room], *question, D, *ans, E]
        assert len(s) <= n_ctx
    assert max(len(s) for s in seqs) == n_ctx  # the longest answer's sequence fills the context exactly


def test_race_truncation_when_question_and_answer_overflow():
    n_ctx = 12  # budget 9
    question, answers = list(range(50, 60)), [[1, 2, 3], [4]]
    seqs = multiple_choice(list(range(100, 120)), question, answers, SP, n_ctx)
    # No article left; the question keeps its tail next to the answer; answers stay whole here.
    assert seqs[0] == [S, 54, 55, 56, 57, 58, 59, D, 1, 2, 3, E]
    assert seqs[1] == [S, 54, 55, 56, 57, 58, 59, D, 4, E]
    seqs = multiple_choice([1], [2], [list(range(30))], SP, n_ctx)
    assert len(seqs[0]) == n_ctx and seqs[0][-2] == 8  # answer keeps its head


# --------------------------------------------------------------------------------------------- with a tokenizer


def test_encode_examples_uses_the_tokenizer_special_ids():
    tok = ToyTokenizer(50)
    task = _task("entailment")
    enc = encode_examples(task, [Example(("a b c", "d e"), label=1, uid="7")], tok, 64)
    seq = enc[0].seqs[0]
    assert seq[0] == tok.start_id == 50 and seq[4] == tok.delim_id == 51 and seq[-1] == tok.extract_id == 52
    assert seq[1:4] == tok.encode("a b c") and seq[5:-1] == tok.encode("d e")
    assert enc[0].label == 1 and enc[0].uid == "7" and enc[0].index == 0


def test_encode_examples_validates_field_counts():
    from gptcli.errors import GPT1Error

    tok = ToyTokenizer(50)
    with pytest.raises(GPT1Error, match="2 text field"):
        encode_examples(_task("entailment"), [Example(("only one",), label=0, source="f.tsv:3")], tok, 64)
    with pytest.raises(GPT1Error, match="f.tsv:9: expected 4 answers"):
        encode_examples(
            _task("multiple_choice", 4, ("A", "B", "C", "D")),
            [Example(("ctx", "q"), choices=("a", "b"), label=0, source="f.tsv:9")],
            tok,
            64,
        )


def test_every_sequence_fits_random_lengths():
    import random

    rng = random.Random(1)
    for _ in range(200):
        n_ctx = rng.randint(8, 40)
        a = list(range(rng.randint(0, 60)))
        b = list(range(rng.randint(0, 60)))
        answers = [list(range(rng.randint(1, 30))) for _ in range(4)]
        for kind, texts, ch in (
            ("classification", [a], []),
            ("entailment", [a, b], []),
            ("similarity", [a, b], []),
            ("multiple_choice", [a, b], answers),
            ("multiple_choice", [a], answers),
        ):
            for s in transform_ids(kind, texts, ch, SP, n_ctx):
                assert len(s) <= n_ctx and s[0] == S and s[-1] == E and s.count(E) == 1
