"""The LSTM baseline through every command: `gpt1 pretrain --preset lstm-tiny` writes a checkpoint that records its
architecture, and finetune (on real SST-2 rows), eval, zeroshot and generate open it without being told;
`convert --to hf` refuses it in one line; a resume onto another architecture is refused by name."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from corpus_helpers import write_corpus
from error_lines import gpt1

from gptcli.checkpoint import load_checkpoint, read_header
from gptcli.model.lstm import LSTMLM

pytestmark = pytest.mark.usefixtures("one_thread")

SHAPE = ["--n-embd", "16", "--n-hidden", "24", "--n-ctx", "96"]
RUNTIME = ["--device", "cpu", "--precision", "fp32"]


def _sentences(path: Path, n: int) -> list[str]:
    rows = path.read_text(encoding="utf-8").splitlines()[1 : n + 1]
    return [r.split("\t")[0] for r in rows]


@pytest.fixture(scope="module")
def lstm_run(tmp_path_factory, shared_data) -> Path:
    """`gpt1 pretrain --preset lstm-tiny` for 4 updates on SST-2 sentences as bytes (the test-bytes tokenizer)."""
    root = tmp_path_factory.mktemp("lstm")
    text = " ".join(_sentences(shared_data / "glue" / "SST-2" / "train.tsv", 300))
    ids = np.frombuffer(text.encode(), dtype=np.uint8).astype(np.int64)
    corpus = write_corpus(root / "corpus", {"train": [[ids[:-2000]]], "val": [[ids[-2000:]]]})
    code = gpt1(
        [
            "pretrain",
            "--data",
            str(corpus),
            "--out",
            str(root / "run"),
            "--preset",
            "lstm-tiny",
            *SHAPE,
            "--dropout",
            "0.2",
            "--seq-len",
            "64",
            "--batch-size",
            "4",
            "--max-steps",
            "4",
            "--warmup-steps",
            "1",
            "--eval-batches",
            "2",
            "--peak-flops",
            "1e11",
            "--quiet",
            *RUNTIME,
        ]
    ).code
    assert code == 0
    return root / "run"


def test_pretrain_records_the_architecture(lstm_run):
    header = read_header(lstm_run)
    assert header.arch == "lstm" and header.step == 4
    assert header.model["n_hidden"] == 24 and header.model["n_embd"] == 16 and header.model["n_ctx"] == 96
    assert header.model["embd_pdrop"] == header.model["out_pdrop"] == 0.2  # --dropout sets the LSTM's dropouts
    assert 'preset = "lstm-tiny"' in (lstm_run / "config.toml").read_text()
    assert isinstance(load_checkpoint(lstm_run).model, LSTMLM)


def test_help_offers_the_lstm_settings(capsys, monkeypatch):
    from help_panels import help_panels, option_row

    model = help_panels(capsys, monkeypatch, "pretrain")["Model"]
    assert "LSTM units per layer" in option_row(model, "--n-hidden")
    assert "lstm-tiny" in option_row(model, "--preset") or "lstm-tiny" in model
    assert "an LSTM's embedding and output dropout" in model.replace("\n", " ")


def test_settings_of_the_other_architecture_and_resumes_onto_it_are_refused(lstm_run, tmp_path, capsys):
    corpus = lstm_run.parent / "corpus"
    capsys.readouterr()
    assert (
        gpt1(
            [
                "pretrain",
                "--data",
                str(corpus),
                "--out",
                str(tmp_path / "x"),
                "--preset",
                "lstm-tiny",
                "--n-head",
                "4",
                *RUNTIME,
            ]
        ).code
        == 1
    )
    err = capsys.readouterr().err
    assert "unknown model setting(s) n_head" in err and "n_hidden" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "x").exists()
    # The run's settings with a Transformer of the same width in place of the LSTM.
    toml = (lstm_run / "config.toml").read_text().replace('preset = "lstm-tiny"', 'preset = "tiny"')
    toml = toml.replace("n_hidden = 24", "n_head = 2").replace("out_pdrop", "resid_pdrop")
    (tmp_path / "t.toml").write_text(toml)
    assert (
        gpt1(
            [
                "pretrain",
                "--config",
                str(tmp_path / "t.toml"),
                "--out",
                str(lstm_run),
                "--max-steps",
                "6",
                "--resume",
                *RUNTIME,
            ]
        ).code
        == 1
    )
    assert "architecture lstm → transformer" in capsys.readouterr().err


def test_finetune_eval_on_real_sst2_rows(lstm_run, shared_data, tmp_path):
    sst2 = shared_data / "glue" / "SST-2"
    out = tmp_path / "ft"
    assert (
        gpt1(
            [
                "finetune",
                "--task",
                "sst2",
                "--init",
                str(lstm_run),
                "--out",
                str(out),
                "--data-dir",
                str(sst2),
                "--max-train-examples",
                "16",
                "--max-eval-examples",
                "8",
                "--batch-size",
                "8",
                "--epochs",
                "1",
                "--lr",
                "1e-3",
                "-q",
                *RUNTIME,
            ]
        ).code
        == 0
    )
    final = out / "checkpoints" / "final"
    header = read_header(final)
    assert header.arch == "lstm" and header.kind == "finetuned" and header.model["n_special"] == 3
    assert "accuracy" in json.loads((out / "results.json").read_text())["scores"]
    assert (
        gpt1(
            [
                "eval",
                "--checkpoint",
                str(out),
                "--data-dir",
                str(sst2),
                "--max-examples",
                "8",
                "--out",
                str(tmp_path / "ev"),
                *RUNTIME,
            ]
        ).code
        == 0
    )
    res = json.loads(next((tmp_path / "ev").rglob("results.json")).read_text())
    assert res["task"] == "sst2" and "accuracy" in res["scores"]


def test_finetune_without_pretraining_builds_an_lstm(lstm_run, shared_data, tmp_path):
    """--init none with a checkpoint as --tokenizer takes its shape (and architecture); --model lstm-tiny with a bare
    tokenizer directory picks the preset's. --transfer-layers counts LSTM layers."""
    sst2 = shared_data / "glue" / "SST-2"
    common = [
        "--task",
        "sst2",
        "--data-dir",
        str(sst2),
        "--max-train-examples",
        "8",
        "--max-eval-examples",
        "8",
        "--batch-size",
        "8",
        "--epochs",
        "1",
        "-q",
        *RUNTIME,
    ]
    assert (
        gpt1(["finetune", "--init", "none", "--tokenizer", str(lstm_run), "--out", str(tmp_path / "a"), *common]).code
        == 0
    )
    a = read_header(tmp_path / "a" / "checkpoints" / "final")
    assert a.arch == "lstm" and a.model["n_hidden"] == 24
    tokenizer = lstm_run.parent / "corpus" / "tokenizer"
    assert (
        gpt1(
            [
                "finetune",
                "--init",
                "none",
                "--model",
                "lstm-tiny",
                "--tokenizer",
                str(tokenizer),
                "--out",
                str(tmp_path / "p"),
                *common,
            ]
        ).code
        == 0
    )
    p = read_header(tmp_path / "p" / "checkpoints" / "final")
    assert p.arch == "lstm" and p.model["n_hidden"] == 768 and p.model["vocab_size"] == 256
    assert (
        gpt1(
            ["finetune", "--init", str(lstm_run), "--transfer-layers", "0", "--out", str(tmp_path / "b"), *common]
        ).code
        == 0
    )
    assert (
        gpt1(
            ["finetune", "--init", str(lstm_run), "--transfer-layers", "2", "--out", str(tmp_path / "c"), *common]
        ).code
        == 1
    )


def test_zeroshot_and_generate(lstm_run, shared_data, tmp_path, capsys):
    out = tmp_path / "zs"
    assert (
        gpt1(
            [
                "zeroshot",
                "--task",
                "sst2",
                "--checkpoint",
                str(lstm_run),
                "--data-dir",
                str(shared_data / "glue" / "SST-2"),
                "--limit",
                "12",
                "--out",
                str(out),
                *RUNTIME,
            ]
        ).code
        == 0
    )
    res = json.loads((out / "results.json").read_text())
    assert res["tasks"]["sst2"]["n"] == 12
    capsys.readouterr()
    assert (
        gpt1(
            ["generate", "--checkpoint", str(lstm_run), "--prompt", "it is a", "-n", "8", "--greedy", "--device", "cpu"]
        ).code
        == 0
    )
    assert capsys.readouterr().out.strip()


def test_convert_to_hf_refuses_an_lstm(lstm_run, tmp_path, capsys):
    capsys.readouterr()
    assert gpt1(["convert", "--to", "hf", str(lstm_run), "--out", str(tmp_path / "hf")]).code == 1
    err = capsys.readouterr().err.strip()
    assert "an lstm checkpoint cannot be exported" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "hf").exists()
