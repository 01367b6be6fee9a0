"""Issue #17, data loss 3 for `gpt1 quickstart`: --overwrite replaces only an earlier quickstart (marked as one),
never a folder holding anything else or one inside what it reads; the earlier quickstart survives a failed or
interrupted replacement."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from gptcli.cli import main
from gptcli.config import save_config
from gptcli.files.outputs import kind_of
from gptcli.pipelines.quickstart import QuickstartConfig
from tests.faults.conftest import cli_text as gpt1
from tests.faults.conftest import snapshot

pytestmark = pytest.mark.usefixtures("one_thread")

# As tests/pipelines/test_quickstart.py: a whole run in a few seconds on 2 CPU cores.
TINY = {
    "minutes": 1.0,
    "max_modules": 80,
    "vocab_size": 400,
    "model": {"n_layer": 1, "n_embd": 32, "n_head": 2, "n_inner": 64, "n_ctx": 48},
    "seq_len": 48,
    "batch_size": 8,
    "pretrain_steps": 4,
    "eval_batches": 2,
    "finetune_epochs": 1,
    "max_train_examples": 48,
    "zeroshot_fit_examples": 32,
    "workers": 1,
    "device": "cpu",
    "precision": "fp32",
}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    f = tmp_path_factory.mktemp("cfg") / "tiny.toml"
    save_config(QuickstartConfig(**TINY), f)
    return f


@pytest.fixture(scope="module")
def earlier(tiny, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("qs") / "out"
    with pytest.raises(SystemExit) as e:
        main(["quickstart", "--config", str(tiny), "--out", str(out)])
    assert e.value.code == 0
    return out


def test_a_folder_of_unrelated_files_is_refused(tiny, tmp_path, capsys):
    notes = tmp_path / "my-notes"
    notes.mkdir()
    (notes / "thesis.txt").write_text("years of work\n")
    (notes / "summary.json").write_text("{}")  # a name quickstart also writes
    before = snapshot(notes)
    code, text = gpt1(capsys, "quickstart", "--config", tiny, "--out", notes, "--overwrite")
    assert code == 1 and "holds files quickstart did not write (thesis.txt)" in text
    assert [line for line in text.splitlines() if line.strip()] == [text.strip()]  # the error alone, no header first
    assert snapshot(notes) == before


def test_out_inside_the_text_it_reads_is_refused(tiny, tmp_path, capsys):
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "mod.py").write_text('"""A module docstring."""\n')
    code, text = gpt1(capsys, "quickstart", "--config", tiny, "--stdlib", lib, "--out", lib / "qs")
    assert code == 1 and "is inside the input" in text
    assert [p.name for p in lib.iterdir()] == ["mod.py"]


def test_an_earlier_quickstart_needs_overwrite(earlier, tiny, capsys):
    before = snapshot(earlier)
    code, text = gpt1(capsys, "quickstart", "--config", tiny, "--out", earlier)
    assert code == 1 and "pass --overwrite" in text
    assert snapshot(earlier) == before and kind_of(earlier) == "quickstart"


@pytest.mark.parametrize(
    "stage, fault, exit_code",
    [
        ("zeroshot_models", OSError(errno.ENOSPC, "No space left on device"), 1),
        ("prepare_corpus", KeyboardInterrupt(), 130),
    ],
)
def test_the_earlier_quickstart_survives_a_failed_or_interrupted_replacement(
    earlier, tiny, capsys, monkeypatch, stage, fault, exit_code
):
    import gptcli.pipelines.quickstart as qs

    before = snapshot(earlier)

    def failing(*a, **k):
        raise fault

    monkeypatch.setattr(qs, stage, failing)
    code, text = gpt1(capsys, "quickstart", "--config", tiny, "--out", earlier, "--overwrite", "--seed", "5")
    assert code == exit_code and "Traceback" not in text
    assert snapshot(earlier) == before
    assert [p.name for p in earlier.parent.iterdir()] == ["out"]


@pytest.mark.parametrize("existed", [False, True])
def test_a_first_quickstart_that_fails_leaves_nothing_behind(tiny, tmp_path, capsys, monkeypatch, existed):
    """Ctrl-C in a first run used to leave a half-written folder that the same command then refused as "not
    empty"; now the folder is as it was (gone, or empty), and the command runs again as it is."""
    import gptcli.pipelines.quickstart as qs

    out = tmp_path / "qs"
    if existed:
        out.mkdir()

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(qs, "pretrain_model", interrupted)
        code, text = gpt1(capsys, "quickstart", "--config", tiny, "--out", out)
    assert code == 130 and "Traceback" not in text
    assert list(out.iterdir()) == [] if existed else not out.exists()
    assert gpt1(capsys, "quickstart", "--config", tiny, "--out", out)[0] == 0


def test_an_unfinished_quickstart_is_run_again_without_overwrite(earlier, tiny, tmp_path, capsys):
    """A quickstart killed outright (no clean-up possible) has no summary.json: nothing to keep, no flag needed."""
    import shutil

    out = tmp_path / "out"
    shutil.copytree(earlier, out)
    (out / "summary.json").unlink()
    shutil.rmtree(out / "zeroshot")
    assert gpt1(capsys, "quickstart", "--config", tiny, "--out", out)[0] == 0
    assert (out / "summary.json").is_file() and (out / "zeroshot").is_dir()


def test_an_earlier_quickstart_is_replaced_with_overwrite(tiny, tmp_path, capsys):
    out = tmp_path / "out"
    assert gpt1(capsys, "quickstart", "--config", tiny, "--out", out)[0] == 0
    (out / "corpus" / "stale.txt").write_text("x")
    code, text = gpt1(capsys, "quickstart", "--config", tiny, "--out", out, "--overwrite", "--seed", "5")
    assert code == 0, text
    assert '"seed": 5' in (out / "summary.json").read_text() and not (out / "corpus" / "stale.txt").exists()
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(".")) == [".gpt1-output"]
