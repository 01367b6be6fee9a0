"""Hub ids as checkpoints (gptcli/interop/hub.py) and the short command lines they make possible:
`gpt1 zeroshot --task sst2` and `gpt1 finetune --task rte` with OpenAI's released GPT-1 as the default model.

The Hub is a local stand-in (tests/helpers/hub_standin.py): a small random ``OpenAIGPTLMHeadModel`` with the real
40,478-token BPE vocabulary, written by transformers into the Hugging Face cache layout under
``openai-community/openai-gpt``, read with ``HF_HUB_OFFLINE`` set. Nothing is downloaded.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from error_lines import gpt1
from hub_standin import MODEL_COMMIT, glue_tables, use_cache, write_dataset_repo, write_gpt1_repo

pytestmark = pytest.mark.usefixtures("one_thread")
pytest.importorskip("huggingface_hub")
pytest.importorskip("transformers")

CPU = ["--device", "cpu", "--precision", "fp32"]


@pytest.fixture(scope="session")
def hub_cache(tmp_path_factory, shared_data) -> Path:
    """The stand-in Hub cache, built once per session (~2 s)."""
    cache = tmp_path_factory.mktemp("hf") / "hub"
    write_gpt1_repo(cache, shared_data / "openai-gpt-bpe")
    return cache


@pytest.fixture
def hub(hub_cache, monkeypatch) -> Path:
    use_cache(monkeypatch, hub_cache)
    return hub_cache / "models--openai-community--openai-gpt" / "snapshots" / MODEL_COMMIT


@pytest.fixture
def conversions(monkeypatch) -> list[Path]:
    """Every conversion into the model cache, recorded (a cache hit converts nothing)."""
    import gptcli.interop.hub as hubmod

    seen: list[Path] = []
    real = hubmod.convert_to_checkpoint

    def counting(converted, out):
        seen.append(Path(out))
        return real(converted, out)

    monkeypatch.setattr(hubmod, "convert_to_checkpoint", counting)
    return seen


@pytest.fixture
def data_root(shared_data, tmp_path, monkeypatch) -> Path:
    """$GPT1_DATA with cuts of the real files in the official layout: RTE (16 train, 8 dev rows), SST-2 (40 dev)."""
    root = tmp_path / "data"
    for folder, files in (("RTE", {"train.tsv": 16, "dev.tsv": 8}), ("SST-2", {"dev.tsv": 40})):
        (root / folder).mkdir(parents=True)
        for name, n in files.items():
            lines = (shared_data / "glue" / folder / name).read_text(encoding="utf-8").splitlines(keepends=True)
            (root / folder / name).write_text("".join(lines[: n + 1]), encoding="utf-8")
    monkeypatch.setenv("GPT1_DATA", str(root))
    return root


# --------------------------------------------------------------------------------------------------- ids
def test_ids_paths_and_short_names(tmp_path, monkeypatch):
    from gptcli.interop.hub import HubId, hub_id_of, parse_hub_id

    assert parse_hub_id("openai-gpt") == HubId("openai-community/openai-gpt")
    assert parse_hub_id("openai-gpt@v1") == HubId("openai-community/openai-gpt", "v1")
    assert parse_hub_id("someone/my-gpt1@" + MODEL_COMMIT) == HubId("someone/my-gpt1", MODEL_COMMIT)
    for not_an_id in ("none", "ckpt", "a/b/c", "a--b/c", "/abs/dir", "", "a/b@"):
        assert parse_hub_id(not_an_id) is None, not_an_id
    monkeypatch.chdir(tmp_path)
    assert hub_id_of("runs/x") == HubId("runs/x")  # nothing local called runs/: it may be a Hub id
    (tmp_path / "runs").mkdir()
    assert hub_id_of("runs/x") is None  # runs/ is here: a missing checkpoint, never a Hub lookup
    (tmp_path / "openai-gpt").mkdir()
    assert hub_id_of("openai-gpt") is None and hub_id_of("./anything") is None  # a local path always wins


# ----------------------------------------------------------------------------------- library: pretrained()
def test_pretrained_converts_once_with_the_original_tokenizer(hub, conversions, tmp_path, monkeypatch):
    from gptcli.checkpoint import load_checkpoint
    from gptcli.interop.hub import fetch_model, models_root, parse_hub_id, pretrained
    from gptcli.progress import RecordingProgress

    path = pretrained("openai-gpt")
    assert path == models_root() / "openai-community--openai-gpt" / MODEL_COMMIT
    ck = load_checkpoint(path)
    assert ck.tokenizer.kind == "openai" and ck.tokenizer.vocab_size == 40478 and ck.config.n_layer == 2
    assert ck.meta["source"]["hub"] == "openai-community/openai-gpt" and ck.meta["source"]["commit"] == MODEL_COMMIT
    stamp = (path / "config.json").stat().st_mtime_ns
    again = fetch_model(parse_hub_id("openai-community/openai-gpt"))
    assert again.cached and again.path == path and len(conversions) == 1
    assert (path / "config.json").stat().st_mtime_ns == stamp
    # The Hugging Face cache cleared, offline: the converted copy is still found (refs/main remembers its commit).
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "empty"))
    rec = RecordingProgress()
    assert fetch_model(parse_hub_id("openai-gpt"), progress=rec).path == path and len(conversions) == 1
    assert "using the converted copy of commit" in rec.of("note")[0]["message"]


def test_a_commit_revision_needs_no_hub_call(hub, conversions, monkeypatch):
    from gptcli.interop.hub import pretrained

    first = pretrained(f"openai-gpt@{MODEL_COMMIT}")
    monkeypatch.setattr("gptcli.interop.hub.download", lambda hub: pytest.fail("asked the Hub for a commit it has"))
    assert pretrained(f"openai-community/openai-gpt@{MODEL_COMMIT}") == first and len(conversions) == 1


# ------------------------------------------------------------------------------------- the short commands
def _scores(run: Path) -> dict:
    return json.loads((run / "results.json").read_text())


def test_zeroshot_sst2_uses_the_released_model_and_its_cache(hub, data_root, conversions, tmp_path, capsys):
    code, out, err = gpt1(
        ["zeroshot", "--task", "sst2", "--limit", "24", "--out", tmp_path / "zs1", *CPU], capsys, unwrap_err=True
    )
    assert code == 0, err
    assert "model: openai-gpt (no --checkpoint given: OpenAI's released GPT-1, the paper's model)" in err
    assert f"openai-community/openai-gpt@{MODEL_COMMIT[:8]} (converted:" in err and len(conversions) == 1
    # Again: the cache, no conversion; then the same model as a local path (converted by `gpt1 convert`).
    code, _, err = gpt1(
        ["zeroshot", "--task", "sst2", "--limit", "24", "--out", tmp_path / "zs2", *CPU], capsys, unwrap_err=True
    )
    assert code == 0 and f"@{MODEL_COMMIT[:8]} (cached:" in err and len(conversions) == 1, err
    code, _, err = gpt1(["convert", "--from", "hf", hub, "--out", tmp_path / "ck"], capsys, unwrap_err=True)
    assert code == 0, err
    code, _, err = gpt1(
        [
            "zeroshot",
            "--task",
            "sst2",
            "--limit",
            "24",
            "--checkpoint",
            tmp_path / "ck",
            "--out",
            tmp_path / "zs3",
            *CPU,
        ],
        capsys,
        unwrap_err=True,
    )
    assert code == 0 and "model:" not in err, err
    a, b, c = (_scores(tmp_path / d)["tasks"]["sst2"] for d in ("zs1", "zs2", "zs3"))
    assert a["n"] == 24 and a["score"] == b["score"] == c["score"]
    preds = [(tmp_path / d / "predictions-sst2.jsonl").read_text() for d in ("zs1", "zs3")]
    assert preds[0] == preds[1]  # every example scored the same


def test_finetune_rte_with_no_init_and_no_out(hub, data_root, conversions, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    short = ["finetune", "--task", "rte", "--epochs", "1", "--batch-size", "8", "--lr", "1e-3", "-q", *CPU]
    code, out, err = gpt1([*short], capsys, unwrap_err=True)
    assert code == 0, err
    assert "model: openai-gpt (no --init given: OpenAI's released GPT-1, the paper's model)" in err
    assert "run directory: runs/finetune-rte" in err and len(conversions) == 1
    first = _scores(tmp_path / "runs" / "finetune-rte")
    assert first["task"] == "rte" and first["n_eval"] == 8
    # Typed again: a new run directory (never the earlier run), the cached model.
    code, _, err = gpt1([*short], capsys, unwrap_err=True)
    assert code == 0 and "run directory: runs/finetune-rte-2 (runs/finetune-rte exists" in err, err
    assert "(cached:" in err and len(conversions) == 1
    # The same model passed explicitly as a local path gives the same scores.
    assert gpt1(["convert", "--from", "hf", hub, "--out", tmp_path / "ck"], capsys, unwrap_err=True)[0] == 0
    code, _, err = gpt1([*short, "--init", tmp_path / "ck", "--out", tmp_path / "explicit"], capsys, unwrap_err=True)
    assert code == 0, err
    assert (
        _scores(tmp_path / "explicit")["scores"]
        == first["scores"]
        == _scores(tmp_path / "runs" / "finetune-rte-2")["scores"]
    )
    saved = (tmp_path / "runs" / "finetune-rte" / "config.toml").read_text()
    assert f"openai-community--openai-gpt/{MODEL_COMMIT}" in saved  # the run records which commit it started from


def test_offline_and_not_cached_is_one_line(tmp_path, data_root, capsys, monkeypatch):
    use_cache(monkeypatch, tmp_path / "empty-hf-cache")
    monkeypatch.chdir(tmp_path)
    for args in (
        ["zeroshot", "--task", "sst2"],
        ["finetune", "--task", "rte"],
        ["generate", "--prompt", "hello"],
        ["convert", "--from", "hf", "openai-gpt", "--out", tmp_path / "ck"],
    ):
        code, out, err = gpt1([*args], capsys, unwrap_err=True)
        assert code == 1 and "Traceback" not in err, err
        assert err.startswith(
            "error: openai-community/openai-gpt is not in the Hugging Face cache and HF_HUB_OFFLINE "
            "is set (run once with a network"
        ), err
        assert err.count("error:") == 1
    assert not (tmp_path / "ck").exists() and not (tmp_path / "runs").exists()


def test_missing_data_is_reported_before_any_download(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("GPT1_DATA", str(tmp_path / "nothing"))
    monkeypatch.setattr("gptcli.interop.hub.download", lambda hub: pytest.fail("downloaded before checking the data"))
    code, _, err = gpt1(["finetune", "--task", "rte", "--out", tmp_path / "run"], capsys, unwrap_err=True)
    assert code == 1 and "data directory for task 'rte' not found" in err and "`gpt1 fetch rte`" in err
    code, _, err = gpt1(["zeroshot", "--task", "sst2"], capsys, unwrap_err=True)
    assert code == 1 and "data directory for task 'sst2' not found" in err and "`gpt1 fetch sst2`" in err


def test_hub_ids_wherever_a_checkpoint_is_taken(hub, conversions, tmp_path, capsys, monkeypatch):
    from gptcli.checkpoint import load_checkpoint

    code, _, err = gpt1(["convert", "--from", "hf", "openai-gpt", "--out", tmp_path / "ck"], capsys, unwrap_err=True)
    assert code == 0 and "wrote gpt1 checkpoint" in err and conversions == [tmp_path / "ck"], err  # not the cache
    assert load_checkpoint(tmp_path / "ck").meta["source"]["commit"] == MODEL_COMMIT
    code, out, err = gpt1(
        [
            "generate",
            "--checkpoint",
            "openai-community/openai-gpt",
            "--prompt",
            "the ship",
            "-n",
            "3",
            "--greedy",
            "--device",
            "cpu",
        ],
        capsys,
        unwrap_err=True,
    )
    assert code == 0 and out.startswith("the ship") and "model: openai-community/openai-gpt →" in err, err
    code, out, err = gpt1(
        ["generate", "--prompt", "the ship", "-n", "3", "--greedy", "--device", "cpu"], capsys, unwrap_err=True
    )
    assert code == 0 and "(no --checkpoint given" in err and "(cached:" in err and len(conversions) == 2
    # A local directory spelled like the id wins, and nothing is looked up.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "openai-community").mkdir()
    (tmp_path / "ck").rename(tmp_path / "openai-community" / "openai-gpt")
    monkeypatch.setattr("gptcli.interop.hub.download", lambda hub: pytest.fail("looked up a local path on the Hub"))
    code, _, err = gpt1(
        ["generate", "--checkpoint", "openai-community/openai-gpt", "--prompt", "a", "-n", "1", "--device", "cpu"],
        capsys,
        unwrap_err=True,
    )
    assert code == 0 and "model:" not in err, err


def test_missing_task_data_is_fetched_into_the_default_root_only(hub_cache, shared_data, tmp_path, capsys, monkeypatch):
    """`gpt1 finetune --task rte` on a fresh machine: the model and RTE both come from the Hub (its stand-in here),
    RTE into ~/.cache/gpt1/data; a data root the user chose (GPT1_DATA) is never written to."""
    cache = tmp_path / "hf"
    shutil.copytree(hub_cache / "models--openai-community--openai-gpt", cache / "models--openai-community--openai-gpt")
    write_dataset_repo(cache, "nyu-mll/glue", glue_tables(shared_data / "glue", sst2=False))
    use_cache(monkeypatch, cache)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("GPT1_DATA", raising=False)
    monkeypatch.chdir(tmp_path)
    args = [
        "finetune",
        "--task",
        "rte",
        "--epochs",
        "1",
        "--batch-size",
        "4",
        "--max-train-examples",
        "4",
        "--max-eval-examples",
        "4",
        "-q",
        *CPU,
    ]
    code, _, err = gpt1([*args], capsys, unwrap_err=True)
    root = tmp_path / "home" / ".cache" / "gpt1" / "data"
    assert code == 0, err
    assert (
        f"data: RTE is not in {root} (the default data root; GPT1_DATA is not set): fetching it from the Hugging "
        "Face Hub (nyu-mll/glue), once" in err
    )
    assert err.index("data: RTE") < err.index("model: openai-gpt")  # the data first
    assert (root / "RTE" / "dev.tsv").read_bytes() == (shared_data / "glue" / "RTE" / "dev.tsv").read_bytes()
    assert _scores(tmp_path / "runs" / "finetune-rte")["n_eval"] == 4
    monkeypatch.setenv("GPT1_DATA", str(tmp_path / "mine"))
    code, _, err = gpt1([*args], capsys, unwrap_err=True)
    assert code == 1 and "data directory for task 'rte' not found" in err and "`gpt1 fetch rte`" in err
    assert not (tmp_path / "mine").exists()
