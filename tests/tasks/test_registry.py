"""Task registry and loaders: real GLUE / Story Cloze files, hand-written fixtures, and every bad-row case."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from gptcli.errors import DataError, GPT1Error
from gptcli.tasks import FAMILIES, all_tasks, get_task, task_rows
from gptcli.tasks.base import ReadOptions
from gptcli.tasks.rows import WRONG_FILE, advised, row_advice

FIXTURES = Path(__file__).parent / "fixtures"

NAMES = {
    "sst2",
    "cola",
    "mrpc",
    "qqp",
    "stsb",
    "mnli",
    "mnli-mm",
    "qnli",
    "rte",
    "wnli",
    "snli",
    "scitail",
    "race",
    "race-m",
    "race-h",
    "storycloze",
}


# ---------------------------------------------------------------------------------------------------------
# Registry


def test_registry_has_every_task_of_the_paper_plus_wnli():
    assert {t.name for t in all_tasks()} == NAMES
    assert FAMILIES == ("glue", "snli", "scitail", "race", "storycloze", "winograd")
    assert get_task("RTE") is get_task("rte")
    with pytest.raises(GPT1Error, match="unknown task 'nope'"):
        get_task("nope")


def test_registry_labels_kinds_metrics_match_glue_and_the_paper():
    expect = {
        "sst2": ("classification", ("0", "1"), "accuracy", 91.3),
        "cola": ("classification", ("0", "1"), "mcc", 45.4),
        "mrpc": ("similarity", ("0", "1"), "f1", 82.3),
        "qqp": ("similarity", ("0", "1"), "f1", 70.3),
        "stsb": ("regression", (), "pearson", 82.0),
        "mnli": ("entailment", ("contradiction", "entailment", "neutral"), "accuracy", 82.1),
        "mnli-mm": ("entailment", ("contradiction", "entailment", "neutral"), "accuracy", 81.4),
        "snli": ("entailment", ("contradiction", "entailment", "neutral"), "accuracy", 89.9),
        "qnli": ("entailment", ("entailment", "not_entailment"), "accuracy", 88.1),
        "rte": ("entailment", ("entailment", "not_entailment"), "accuracy", 56.0),
        "wnli": ("entailment", ("0", "1"), "accuracy", None),
        "scitail": ("entailment", ("entails", "neutral"), "accuracy", 88.3),
        "race": ("multiple_choice", ("A", "B", "C", "D"), "accuracy", 59.0),
        "race-m": ("multiple_choice", ("A", "B", "C", "D"), "accuracy", 62.9),
        "race-h": ("multiple_choice", ("A", "B", "C", "D"), "accuracy", 57.4),
        "storycloze": ("multiple_choice", ("1", "2"), "accuracy", 86.5),
    }
    for name, (kind, labels, metric, paper) in expect.items():
        t = get_task(name)
        assert (t.kind, t.labels, t.metric, t.paper_score) == (kind, labels, metric, paper), name
        assert {"train", "dev", "test"} <= set(t.splits), name
        assert t.source_url and t.notes and t.folder, name
        assert t.n_choices == {"race": 4, "race-m": 4, "race-h": 4, "storycloze": 2}.get(name, 0)
    for name, metrics in {"stsb": ("pearson", "spearman"), "mrpc": ("f1", "accuracy"), "rte": ("accuracy",)}.items():
        assert (get_task(name).metric, *get_task(name).extra_metrics) == metrics, name  # headline first
    assert get_task("mnli").labels[0] == "contradiction"
    assert [get_task(n).glue_name for n in ("mnli", "mnli-mm", "sst2", "stsb")] == [
        "MNLI-m",
        "MNLI-mm",
        "SST-2",
        "STS-B",
    ]


def test_task_rows_are_plain_data_for_list_tasks():
    rows = task_rows()
    assert [r["name"] for r in rows][:3] == ["mnli", "mnli-mm", "snli"]
    rte = next(r for r in rows if r["name"] == "rte")
    assert rte["transformation"] == "<s> premise $ hypothesis <e>"
    assert rte["labels"] == "entailment, not_entailment"
    assert rte["location"] == "$GPT1_DATA/RTE" and rte["files"] == "train.tsv, dev.tsv, test.tsv"
    assert next(r for r in rows if r["name"] == "stsb")["metric"] == "pearson / spearman"
    json.dumps(rows)  # nothing but plain values


# ---------------------------------------------------------------------------------------------------------
# Zero-shot-only tasks (DPRD, WSC273): in the registry, out of fine-tuning's way


def test_zero_shot_only_tasks_are_found_only_when_asked_for():
    assert [t.name for t in all_tasks(zero_shot=True)] == [t.name for t in all_tasks()] + ["dprd", "wsc"]
    assert all(t.finetunable for t in all_tasks())
    assert "dprd" not in {r["name"] for r in task_rows()} and "wsc" not in {r["name"] for r in task_rows()}
    for name in ("dprd", "wsc", "DPRD"):
        with pytest.raises(
            GPT1Error,
            match=rf"task '{name}' is scored zero-shot only: .* \(use `gpt1 zeroshot --task {name.lower()}`\)",
        ):
            get_task(name)
    with pytest.raises(GPT1Error) as e:
        get_task("nope")
    assert "dprd" not in str(e.value)  # fine-tuning's list of known tasks
    dprd, wsc = get_task("dprd", zero_shot=True), get_task("WSC", zero_shot=True)
    for t in (dprd, wsc):
        assert (t.kind, t.metric, t.n_choices, t.labels, t.paper_score) == (
            "pronoun_resolution",
            "accuracy",
            2,
            ("A", "B"),
            None,
        )
        assert not t.finetunable and t.transformation.startswith("none: zero-shot only")
        assert t.source_url and t.notes and "Zero-shot only" in t.notes
    assert (dprd.folder, dict((k, v.files) for k, v in dprd.splits.items())) == (
        "dprd",
        {"train": ("train.c.txt",), "test": ("test.c.txt",)},
    )
    assert (wsc.folder, dict((k, v.files) for k, v in wsc.splits.items())) == ("wsc", {"test": ("WSCollection.xml",)})
    assert get_task("rte", zero_shot=True) is get_task("rte")


def test_real_winograd_files_through_the_registry(shared_data, monkeypatch):
    from gptcli.tasks.winograd import Schema, read_dprd, read_wsc

    dprd = get_task("dprd", zero_shot=True)
    train = dprd.read("train", shared_data / "dprd")
    assert len(train) == 1322 and sum(e.label for e in train) == 661
    assert [Schema.of(e) for e in train] == read_dprd(shared_data / "dprd" / "train.c.txt")
    assert (
        train[0].texts[1] in ("it", "he", "she", "they", "him", "his", "her", "them", "its")
        and len(train[0].choices) == 2
    )
    with pytest.raises(GPT1Error, match=r"test\.c\.txt: missing test file for task 'dprd'"):
        dprd.read("test", shared_data / "dprd")  # only the train file ships here
    monkeypatch.setenv("GPT1_DATA", str(shared_data))  # $GPT1_DATA/wsc/WSCollection.xml, found by the registry
    wsc = get_task("wsc", zero_shot=True).read("test")
    assert len(wsc) == 273 and sum(e.label for e in wsc) == 136
    assert [Schema.of(e) for e in wsc] == read_wsc(shared_data / "wsc" / "WSCollection.xml")
    assert wsc[0].source == f"{shared_data / 'wsc' / 'WSCollection.xml'}:7" and wsc[0].uid == "0"
    with pytest.raises(GPT1Error, match="has no split 'train'"):
        get_task("wsc", zero_shot=True).read("train")


def test_data_dir_under_a_given_root(shared_data, tmp_path, monkeypatch):
    monkeypatch.delenv("GPT1_DATA", raising=False)
    assert get_task("sst2").data_dir(root=shared_data) == shared_data / "glue" / "SST-2"  # a GLUE parent folder
    assert get_task("wsc", zero_shot=True).data_dir(root=shared_data) == shared_data / "wsc"
    with pytest.raises(GPT1Error, match=r"data directory for task 'race' not found \(looked in"):
        get_task("race").data_dir(root=tmp_path)


# ---------------------------------------------------------------------------------------------------------
# Real files (../shared/data): exact row counts and label sets

REAL = [
    ("sst2", "SST-2", "train", 67349, {0, 1}),
    ("sst2", "SST-2", "dev", 872, {0, 1}),
    ("cola", "CoLA", "train", 8551, {0, 1}),
    ("cola", "CoLA", "dev", 1043, {0, 1}),
    ("rte", "RTE", "train", 2490, {0, 1}),
    ("rte", "RTE", "dev", 277, {0, 1}),
    ("mrpc", "MRPC", "train", 3668, {0, 1}),
    ("mrpc", "MRPC", "dev", 408, {0, 1}),
    ("stsb", "STS-B", "train", 5749, None),
    ("stsb", "STS-B", "dev", 1500, None),
    ("qnli", "QNLI", "dev", 5463, {0, 1}),
    ("wnli", "WNLI", "train", 635, {0, 1}),
    ("wnli", "WNLI", "dev", 71, {0, 1}),
]


@pytest.mark.parametrize("name,folder,split,count,labels", REAL, ids=[f"{r[0]}-{r[2]}" for r in REAL])
def test_real_glue_counts_and_labels(shared_data, name, folder, split, count, labels):
    opts = ReadOptions()
    ex = get_task(name).read(split, shared_data / "glue" / folder, opts)
    assert len(ex) == count
    assert opts.skipped == [] and opts.excluded == []
    if labels is None:
        assert all(isinstance(e.label, float) and 0.0 <= e.label <= 5.0 for e in ex)
        assert {e.label for e in ex} >= {0.0, 5.0}
    else:
        assert {e.label for e in ex} == labels
    n_texts = 1 if get_task(name).kind == "classification" else 2
    assert all(len(e.texts) == n_texts and all(t.strip() for t in e.texts) for e in ex)


def test_real_glue_row_contents(shared_data):
    g = shared_data / "glue"
    mrpc = get_task("mrpc").read("train", g / "MRPC")
    # BOM dropped (else the header's "Quality" would not be found); quotes kept verbatim (no quote processing).
    assert mrpc[0].texts[0].startswith('Amrozi accused his brother , whom he called " the witness "')
    assert mrpc[0].label == 1 and mrpc[0].extra == {"#1 ID": "702876", "#2 ID": "702977"}
    assert mrpc[0].source == f"{g / 'MRPC' / 'train.tsv'}:2"
    cola = get_task("cola").read("dev", g / "CoLA")
    assert cola[0].texts == ("The sailors rode the breeze clear of the rocks.",)
    assert cola[0].extra["source"] == "gj04" and cola[0].source.endswith("dev.tsv:1")  # no header line
    rte = get_task("rte").read("dev", g / "RTE")
    assert rte[0].uid == "0" and get_task("rte").labels[rte[0].label] == "not_entailment"
    sst = get_task("sst2").read("dev", g / "SST-2")
    assert sst[0].texts == ("it 's a charming and often affecting journey . ",) and sst[0].label == 1
    stsb = get_task("stsb").read("dev", g / "STS-B")
    assert stsb[0].label == 5.0 and stsb[0].extra["genre"] == "main-captions"


def test_gpt1_data_env_and_glue_parent_folder(shared_data, monkeypatch):
    monkeypatch.setenv("GPT1_DATA", str(shared_data))  # holds glue/RTE and storycloze/
    assert len(get_task("rte").read("dev")) == 277
    assert len(get_task("storycloze").read("val")) == 1871


# ---------------------------------------------------------------------------------------------------------
# Story Cloze: the released code's split of the 2016 validation file


def test_storycloze_real_file_and_released_split(shared_data):
    sklearn_ms = pytest.importorskip("sklearn.model_selection")
    t = get_task("storycloze")
    d = shared_data / "storycloze"
    val = t.read("val", d)
    assert len(val) == 1871
    assert {e.label for e in val} == {0, 1} and all(len(e.choices) == 2 for e in val)
    assert val[0].uid == "138d5bfb-05cc-41e3-bf2c-fa85ebad14e2"
    # The story is the four sentences joined by single spaces (the released code's ' '.join(line[1:5])).
    assert val[0].texts == (
        "Rick grew up in a troubled household. He never found good support in family, and "
        "turned to gangs. It wasn't long before Rick got shot in a robbery. The incident "
        "caused him to turn a new leaf.",
    )
    assert val[0].choices == ("He is happy now.", "He joined a gang.") and val[0].label == 0
    train, dev = t.read("train", d), t.read("dev", d)
    assert (len(train), len(dev)) == (1497, 374)
    # Same rows, same order as the released code's sklearn call.
    ref_tr, ref_dev = sklearn_ms.train_test_split([e.uid for e in val], test_size=374, random_state=3535999445)
    assert [e.uid for e in train] == ref_tr and [e.uid for e in dev] == ref_dev


def test_storycloze_unlabeled_and_bad_rows(tmp_path):
    head = (
        "InputStoryid,InputSentence1,InputSentence2,InputSentence3,InputSentence4,"
        "RandomFifthSentenceQuiz1,RandomFifthSentenceQuiz2"
    )
    p = tmp_path / "cloze_test_val__spring2016 - cloze_test_ALL_val.csv"
    p.write_text(head + '\nid1,A.,"B, with a comma.",C.,D.,E1.,E2.\n', encoding="utf-8")
    ex = get_task("storycloze").read("val", tmp_path)
    assert ex[0].label is None and ex[0].texts == ("A. B, with a comma. C. D.",) and ex[0].uid == "id1"
    p.write_text(
        head + ",AnswerRightEnding\n"
        "id1,A.,B.,C.,D.,E1.,E2.,3\n"
        'id2,A.,"B spans\ntwo lines.",C.,D.,E1.,E2.\n'
        "id3,A.,B.,C.,,E1.,E2.,1\n"
        "id4,A.,B.,C.,D.,E1.,E2.,2\n",
        encoding="utf-8",
    )
    with pytest.raises(DataError) as e:
        get_task("storycloze").read("val", tmp_path)
    assert (
        str(e.value) == f"{p}:2: unknown AnswerRightEnding '3' (expected one of '1', '2'; {row_advice(ReadOptions())})"
    )
    opts = ReadOptions(skip_bad_rows=True)
    ex = get_task("storycloze").read("val", tmp_path, opts)
    assert [x.uid for x in ex] == ["id4"]
    assert opts.skipped == [
        f"{p}:2: unknown AnswerRightEnding '3' (expected one of '1', '2')",
        f"{p}:3: expected 8 comma-separated columns, found 7",
        f"{p}:5: empty InputSentence4",
    ]


# ---------------------------------------------------------------------------------------------------------
# Unlabeled GLUE test files


@pytest.mark.parametrize(
    "name,folder,n,uid0,text0",
    [
        ("sst2", "SST-2", 2, "0", ("a quiet , lovely film .",)),
        ("cola", "CoLA", 2, "0", ("The cat sat on the mat.",)),
        (
            "mrpc",
            "MRPC",
            2,
            "0",
            ("The company said profits rose 5 percent .", "Profits rose 5 percent , the company said ."),
        ),
        ("stsb", "STS-B", 2, "0", ("A girl is styling her hair.", "A girl is brushing her hair.")),
        (
            "qnli",
            "QNLI",
            1,
            "0",
            ("When was the bridge built?", "The bridge was completed in 1932 after four years of work."),
        ),
        ("rte", "RTE", 2, "0", ("The museum reopened after a two-year renovation.", "The museum was renovated.")),
        (
            "wnli",
            "WNLI",
            1,
            "0",
            ("The trophy doesn't fit in the suitcase because it is too big.", "The trophy is too big."),
        ),
    ],
)
def test_unlabeled_glue_test_files(name, folder, n, uid0, text0):
    t = get_task(name)
    assert t.splits["test"].labeled is False
    ex = t.read("test", FIXTURES / "glue_test" / folder)
    assert len(ex) == n and all(e.label is None for e in ex)
    assert [e.uid for e in ex] == [str(i) for i in range(n)]
    assert ex[0].texts == text0


def test_sst2_unlabeled_keeps_unbalanced_quote():
    ex = get_task("sst2").read("test", FIXTURES / "glue_test" / "SST-2")
    assert ex[1].texts == ('it never finds its " rhythm .',)


# ---------------------------------------------------------------------------------------------------------
# Hand-written fixtures for formats with no real file here


def test_mnli_fixture_matched_and_mismatched():
    m, mm = get_task("mnli"), get_task("mnli-mm")
    d = FIXTURES / "MNLI"
    train = m.read("train", d)
    assert len(train) == 5 and mm.read("train", d) == train
    assert [m.labels[e.label] for e in train] == [
        "entailment",
        "contradiction",
        "neutral",
        "entailment",
        "contradiction",
    ]
    assert train[1].texts == ('She said "never again" and left the room.', "She stayed in the room all night.")
    assert train[0].extra == {"promptID": "10001", "pairID": "10001e", "genre": "government"}
    dev_m, dev_mm = m.read("dev", d), mm.read("dev", d)
    assert [m.labels[e.label] for e in dev_m] == ["entailment", "contradiction", "neutral"]
    assert [mm.labels[e.label] for e in dev_mm] == ["entailment", "contradiction"]
    assert dev_mm[0].extra["genre"] == "letters"
    test_m, test_mm = m.read("test", d), mm.read("test", d)
    assert (len(test_m), len(test_mm)) == (2, 1) and all(e.label is None for e in test_m + test_mm)
    assert test_m[1].uid == "1" and test_m[1].texts == ("The dog barked at every passing car.", "The dog was silent.")


def test_qqp_fixture():
    t, d = get_task("qqp"), FIXTURES / "QQP"
    train = t.read("train", d)
    assert [e.label for e in train] == [1, 1, 0, 0]
    assert train[0].uid == "133273" and train[0].extra == {"qid1": "213221", "qid2": "213222"}
    assert train[3].texts[0] == 'Is it "safe" to swim after eating?'
    assert [e.label for e in t.read("dev", d)] == [1, 0, 1]
    test = t.read("test", d)
    assert [e.uid for e in test] == ["0", "1"] and all(e.label is None for e in test)


def test_snli_fixture_skips_no_consensus_rows_by_rule():
    t, d = get_task("snli"), FIXTURES / "snli_1.0"
    opts = ReadOptions()
    train = t.read("train", d, opts)
    assert [t.labels[e.label] for e in train] == ["neutral", "contradiction", "entailment", "entailment"]
    assert opts.skipped == []
    assert opts.excluded == [f"{d / 'snli_1.0_train.jsonl'}:4: gold_label '-' (no consensus label)"]
    assert train[0].texts == ("A child in a red coat runs across a field.", "The child is late for school.")
    assert train[3].source == f"{d / 'snli_1.0_train.jsonl'}:5"
    opts = ReadOptions()
    assert len(t.read("dev", d, opts)) == 2 and len(opts.excluded) == 1
    assert len(t.read("test", d)) == 2


def test_scitail_fixture():
    t, d = get_task("scitail"), FIXTURES / "SciTailV1.1"
    train = t.read("train", d)
    assert [t.labels[e.label] for e in train] == ["entails", "neutral", "entails", "neutral"]
    assert train[2].texts[0] == 'Mitochondria are called the "powerhouse" of the cell.'
    assert (len(t.read("dev", d)), len(t.read("test", d))) == (2, 2)


def test_race_fixture_levels_order_and_fields():
    d = FIXTURES / "RACE"
    race = get_task("race").read("train", d)
    # middle first, files in numeric order (1, 2, 10), one example per question; then high.
    assert [e.uid for e in race] == [
        "middle1.txt-0",
        "middle1.txt-1",
        "middle2.txt-0",
        "middle10.txt-0",
        "high1.txt-0",
        "high1.txt-1",
    ]
    assert [e.label for e in race] == [1, 2, 1, 2, 1, 0]
    e = race[0]
    assert e.texts[1] == "Where does Tom live?" and e.texts[0].startswith("Tom lives in a small town")
    assert "\n" in e.texts[0]  # the article is kept verbatim
    assert e.choices == ("In a big city.", "In a small town near the sea.", "On a farm.", "In the mountains.")
    assert e.extra == {"level": "middle", "question": 0}
    assert len(get_task("race-m").read("train", d)) == 4
    assert [x.extra["level"] for x in get_task("race-h").read("train", d)] == ["high", "high"]
    assert len(get_task("race").read("dev", d)) == 2 and len(get_task("race").read("test", d)) == 3


# ---------------------------------------------------------------------------------------------------------
# Missing data


def test_missing_data_messages(tmp_path, monkeypatch):
    monkeypatch.delenv("GPT1_DATA", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # the default data root: ~/.cache/gpt1/data
    with pytest.raises(GPT1Error) as e:
        get_task("rte").read("dev")
    msg = str(e.value)
    default = tmp_path / "home" / ".cache" / "gpt1" / "data"
    assert msg.startswith(f"{default / 'RTE'}: data directory for task 'rte' not found"), msg
    assert "GPT1_DATA is not set" in msg and "train.tsv, dev.tsv, test.tsv" in msg
    assert "`gpt1 fetch rte`" in msg and "gluebenchmark.com" in msg
    with pytest.raises(GPT1Error) as e:
        get_task("storycloze").read("val")
    assert "request form" in str(e.value) and "https://cs.rochester.edu/nlp/rocstories/" in str(e.value)
    assert "gpt1 fetch" not in str(e.value)
    monkeypatch.setenv("GPT1_DATA", str(tmp_path))
    with pytest.raises(GPT1Error) as e:
        get_task("snli").read("train")
    msg = str(e.value)
    assert str(tmp_path / "snli_1.0") in msg and "snli_1.0_train.jsonl" in msg and "snli_1.0.zip" in msg
    (tmp_path / "RTE").mkdir()
    with pytest.raises(GPT1Error) as e:
        get_task("rte").read("train")
    assert str(e.value).startswith(f"{tmp_path / 'RTE' / 'train.tsv'}: missing train file for task 'rte'")
    with pytest.raises(GPT1Error, match="not found"):
        get_task("race").read("train", tmp_path / "nowhere")
    with pytest.raises(GPT1Error, match="has no split 'val'"):
        get_task("rte").read("val", tmp_path / "RTE")


# ---------------------------------------------------------------------------------------------------------
# Bad rows: exact `path:line: reason`, default stop, skip mode counts


def _write(d: Path, name: str, text: str | bytes) -> Path:
    p = d / name
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8"))
    return p


RTE_HEAD = "index\tsentence1\tsentence2\tlabel\n"

BAD_GLUE = [
    ("rte", RTE_HEAD + "0\tA.\tB.\tentailment\n1\tA.\tB.\n", 3, "expected 4 tab-separated columns, found 3"),
    (
        "rte",
        RTE_HEAD + "0\tA.\tB.\tmaybe\n",
        2,
        "unknown label 'maybe' (expected one of 'entailment', 'not_entailment')",
    ),
    ("rte", RTE_HEAD + "0\tA.\t  \tentailment\n", 2, "empty sentence2"),
    ("rte", "index\tsentence1\tlabel\n", 1, "header lacks column 'sentence2' (found: index, sentence1, label)"),
    (
        "rte",
        "idx\tsentence1\tsentence2\n",
        1,
        "header has neither the label column 'label' nor the id column 'index' "
        "of an unlabeled test file (found: idx, sentence1, sentence2)",
    ),
    (
        "rte",
        b"index\tsentence1\tsentence2\tlabel\n0\tA\xff.\tB.\tentailment\n",
        2,
        "not valid UTF-8 (invalid start byte at byte 3)",
    ),
    ("rte", "", 1, "empty file (expected a header line)"),
    ("sst2", "sentence\tlabel\ngood .\t2\n", 2, "unknown label '2' (expected one of '0', '1')"),
    ("stsb", "index\tsentence1\tsentence2\tscore\n0\tA.\tB.\t5.5\n", 2, "score '5.5' is outside [0, 5]"),
    ("stsb", "index\tsentence1\tsentence2\tscore\n0\tA.\tB.\thigh\n", 2, "score 'high' is not a number"),
    ("mrpc", "\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String\n1\t1\t2\t\tB .\n", 2, "empty #1 String"),
    (
        "qqp",
        "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate\n0\t1\t2\tA?\tB?\tyes\n",
        2,
        "unknown is_duplicate 'yes' (expected one of '0', '1')",
    ),
    (
        "mnli",
        "index\tsentence1\tsentence2\tgold_label\n0\tA.\tB.\tentails\n",
        2,
        "unknown gold_label 'entails' (expected one of 'contradiction', 'entailment', 'neutral')",
    ),
    ("cola", "gj04\t1\t\tGood.\ngj04\t1\tGood.\n", 2, "expected 4 tab-separated columns, found 3"),
    ("cola", "gj04\t7\t\tGood.\n", 1, "unknown label '7' (expected one of '0', '1')"),
    ("cola", "gj04\t0\t*\t\n", 1, "empty sentence"),
]


@pytest.mark.parametrize("name,content,line,reason", BAD_GLUE)
def test_bad_glue_rows(tmp_path, name, content, line, reason):
    """``path:line: what (what to do)``: a bad row is fixed or removed (or skipped where the command can); a header
    or a first line not of the format means another file than the task's."""
    p = _write(tmp_path, "dev.tsv" if name != "mnli" else "dev_matched.tsv", content)
    with pytest.raises(DataError) as e:
        get_task(name).read("dev", tmp_path)
    advice = WRONG_FILE if "header" in reason or "empty file" in reason else row_advice(ReadOptions())
    assert str(e.value) == f"{p}:{line}: {advised(reason, advice)}"
    assert str(e.value).endswith(")") and str(e.value).count("(") == str(e.value).count(")")
    with (
        pytest.raises(DataError, match="fix or remove the line, or pass --skip-bad-rows")
        if advice != WRONG_FILE
        else pytest.raises(DataError, match=re.escape(WRONG_FILE))
    ):
        get_task(name).read("dev", tmp_path, ReadOptions(skippable=True))


def test_skip_bad_rows_counts_and_keeps_the_rest(tmp_path):
    p = _write(
        tmp_path,
        "dev.tsv",
        RTE_HEAD + "0\tA.\tB.\tentailment\n"
        "1\tA.\tB.\n"
        "2\tA.\tB.\tmaybe\n"
        "\n"
        "3\tA.\tB.\tnot_entailment\r\n"
        "4\t\tB.\tentailment",
    )
    opts = ReadOptions(skip_bad_rows=True)
    ex = get_task("rte").read("dev", tmp_path, opts)
    assert [(e.uid, e.label) for e in ex] == [("0", 0), ("3", 1)]
    assert ex[1].texts == ("A.", "B.") and ex[1].source == f"{p}:6"
    assert opts.skipped == [
        f"{p}:3: expected 4 tab-separated columns, found 3",
        f"{p}:4: unknown label 'maybe' (expected one of 'entailment', 'not_entailment')",
        f"{p}:7: empty sentence1",
    ]


def test_bad_snli_rows(tmp_path):
    good = {"gold_label": "neutral", "sentence1": "A.", "sentence2": "B.", "pairID": "p1"}
    p = _write(
        tmp_path,
        "snli_1.0_dev.jsonl",
        "\n".join(
            [
                json.dumps(good),
                "{not json",
                json.dumps({**good, "gold_label": "maybe"}),
                json.dumps({k: v for k, v in good.items() if k != "sentence2"}),
                json.dumps({**good, "sentence1": ""}),
                json.dumps({**good, "gold_label": "-"}),
                "[1, 2]",
            ]
        )
        + "\n",
    )
    with pytest.raises(DataError) as e:
        get_task("snli").read("dev", tmp_path)
    assert str(e.value) == advised(
        f"{p}:2: not a JSON object (Expecting property name enclosed in double quotes at column 2)",
        row_advice(ReadOptions()),
    )  # what to do, at the end
    opts = ReadOptions(skip_bad_rows=True)
    ex = get_task("snli").read("dev", tmp_path, opts)
    assert [e.uid for e in ex] == ["p1"]
    assert opts.skipped[1:] == [
        f"{p}:3: unknown gold_label 'maybe' (expected one of 'contradiction', 'entailment', 'neutral')",
        f"{p}:4: missing field 'sentence2'",
        f"{p}:5: empty sentence1",
        f"{p}:7: not a JSON object",
    ]
    assert opts.excluded == [f"{p}:6: gold_label '-' (no consensus label)"]


def test_bad_scitail_rows(tmp_path):
    p = _write(tmp_path, "tsv_format/scitail_1.0_dev.tsv", "A.\tB.\tentails\nA.\tB.\tcontradicts\nA.\tB.\n")
    with pytest.raises(DataError) as e:
        get_task("scitail").read("dev", tmp_path)
    assert str(e.value) == advised(
        f"{p}:2: unknown label 'contradicts' (expected one of 'entails', 'neutral')", row_advice(ReadOptions())
    )  # what to do, at the end
    opts = ReadOptions(skip_bad_rows=True)
    assert len(get_task("scitail").read("dev", tmp_path, opts)) == 1
    assert opts.skipped[1] == f"{p}:3: expected 3 tab-separated columns, found 2"


def test_bad_race_files(tmp_path):
    obj = {
        "article": "Text.",
        "questions": ["Q1?", "Q2?", "Q3?"],
        "id": "middle1.txt",
        "options": [["a", "b", "c", "d"], ["a", "b", "c"], ["a", "b", "", "d"]],
        "answers": ["A", "B", "E"],
    }
    p1 = _write(tmp_path, "dev/middle/1.txt", json.dumps(obj))
    p2 = _write(tmp_path, "dev/middle/2.txt", json.dumps({**obj, "answers": ["A"]}))
    p3 = _write(tmp_path, "dev/middle/3.txt", "{oops")
    p4 = _write(tmp_path, "dev/middle/4.txt", json.dumps({**obj, "article": " ", "answers": ["A", "B", "C"]}))
    obj5 = {**obj, "options": [["a", "b", "c", "d"]] * 3, "answers": ["A", "E", "D"]}
    _write(tmp_path, "dev/middle/5.txt", json.dumps(obj5))
    with pytest.raises(DataError) as e:
        get_task("race-m").read("dev", tmp_path)
    assert str(e.value) == advised(
        f"{p1}:1: question 1: 3 options (expected 4)", row_advice(ReadOptions())
    )  # what to do, at the end
    opts = ReadOptions(skip_bad_rows=True)
    ex = get_task("race-m").read("dev", tmp_path, opts)
    assert [x.uid for x in ex] == ["middle1.txt-0", "middle1.txt-0", "middle1.txt-2"]
    assert [x.label for x in ex] == [0, 0, 3]
    assert opts.skipped == [
        f"{p1}:1: question 1: 3 options (expected 4)",
        f"{p1}:1: question 2: empty option C",
        f"{p2}:1: 3 questions, 3 option lists and 1 answers (must be equal)",
        f"{p3}:1: not a JSON object (Expecting property name enclosed in double quotes at line 1 column 2)",
        f"{p4}:1: empty article",
        f"{tmp_path / 'dev/middle/5.txt'}:1: question 1: unknown answer 'E' (expected one of 'A', 'B', 'C', 'D')",
    ]
