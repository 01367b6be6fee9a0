"""Issue #31, class 6: one rule per setting, in one table (``gptcli.config.RULES``), the same wherever the field
appears, checked whenever a config is built (the command line and ``--config`` files, :func:`gptcli.config.from_dict`)
and by the library entry points, before any work: NaN and the infinities are refused for every number.

Each case: exit 1, one line ``--KEY VALUE is impossible (it must be …)``, no traceback, nothing written.
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
import typing
from pathlib import Path

import pytest
from error_lines import assert_one_line_error

from gptcli.config import RULES, SEED_LIMIT, check_setting
from gptcli.errors import GPT1Error
from tests.faults.conftest import TINY_ARGS, gpt1

pytestmark = pytest.mark.usefixtures("one_thread")

SCITAIL = Path(__file__).resolve().parents[1] / "tasks" / "fixtures" / "SciTailV1.1"


def _base(command: str, corpus: Path, run: Path, tmp: Path) -> list:
    return {
        "prepare": ["prepare", corpus / "manifest.json", "--out", tmp / "o"],
        "pretrain": ["pretrain", "--data", corpus, "--out", tmp / "o", *TINY_ARGS, "--max-steps", "1"],
        "finetune": [
            "finetune",
            "--task",
            "scitail",
            "--init",
            run,
            "--out",
            tmp / "o",
            "--data-dir",
            SCITAIL,
            "--device",
            "cpu",
            "-q",
        ],
        "eval": ["eval", "--checkpoint", run, "--data", corpus, "--device", "cpu"],
        "zeroshot": ["zeroshot", "--checkpoint", run, "--task", "dprd", "--device", "cpu"],
        "generate": ["generate", "--checkpoint", run, "--prompt", "the", "--device", "cpu"],
        "quickstart": ["quickstart", "--out", tmp / "o"],
    }[command]


CASES = [
    ("finetune", ["--lr", "nan"], "--lr nan"),
    ("finetune", ["--lr", "inf"], "--lr inf"),
    ("finetune", ["--max-train-examples", "-5"], "--max-train-examples -5"),
    ("finetune", ["--max-eval-examples", "-1"], "--max-eval-examples -1"),
    ("finetune", ["--eval-batch-size", "-1"], "--eval-batch-size -1"),
    ("finetune", ["--grad-clip", "-1"], "--grad-clip -1.0"),
    ("finetune", ["--weight-decay", "-1"], "--weight-decay -1.0"),
    ("finetune", ["--seed", "-1"], "--seed -1"),
    ("finetune", ["--seed", "99999999999999999999"], "--seed 99999999999999999999"),
    ("finetune", ["--n-ctx", "0"], "--n-ctx 0"),
    ("finetune", ["--warmup", "nan"], "--warmup nan"),
    ("finetune", ["--clf-pdrop", "1"], "--clf-pdrop 1.0"),
    ("finetune", ["--dropout", "1.5"], "--dropout 1.5"),  # was torch's ValueError from the rebuilt model
    ("finetune", ["--dropout", "-0.1"], "--dropout -0.1"),
    ("finetune", ["--batch-size", "0"], "--batch-size 0"),
    ("pretrain", ["--seed", "99999999999999999999"], "--seed 99999999999999999999"),
    ("pretrain", ["--seq-len", "-3"], "--seq-len -3"),
    ("pretrain", ["--lr", "nan"], "--lr nan"),
    ("pretrain", ["--n-ctx", "0"], "--n-ctx 0"),
    ("pretrain", ["--weight-decay", "inf"], "--weight-decay inf"),
    ("eval", ["--batch-size", "0"], "--batch-size 0"),
    ("eval", ["--seq-len", "-3"], "--seq-len -3"),
    ("eval", ["--max-batches", "-1"], "--max-batches -1"),
    ("zeroshot", ["--threshold", "nan"], "--threshold nan"),
    ("zeroshot", ["--threshold", "inf"], "--threshold inf"),
    ("zeroshot", ["--limit", "-2"], "--limit -2"),
    ("generate", ["--samples", "100000"], "--samples 100000"),
    ("generate", ["--samples", "0"], "--samples 0"),
    ("generate", ["--temperature", "nan"], "--temperature nan"),
    ("generate", ["--top-p", "0"], "--top-p 0.0"),
    ("generate", ["--seed", "-7"], "--seed -7"),
    ("prepare", ["--seed", "-1"], "--seed -1"),
    ("prepare", ["--val-fraction", "nan"], "--val-fraction nan"),
    ("prepare", ["--character-coverage", "0"], "--character-coverage 0.0"),
    ("quickstart", ["--minutes", "nan"], "--minutes nan"),
    ("quickstart", ["--seed", "-1"], "--seed -1"),
]


@pytest.mark.parametrize("command,flags,named", CASES, ids=[f"{c}{' '.join(f)}" for c, f, _ in CASES])
def test_an_impossible_number_is_one_line_in_every_command(corpus, run, tmp_path, capsys, command, flags, named):
    res = gpt1([*_base(command, corpus, run, tmp_path), *flags], capsys)
    assert_one_line_error(res, f"{named} is impossible (it must be ")
    assert not (tmp_path / "o").exists()


def test_a_config_file_gets_the_same_rule(corpus, tmp_path, capsys):
    cfg = tmp_path / "ft.toml"
    cfg.write_text('task = "scitail"\nlr = nan\n')
    assert_one_line_error(gpt1(["finetune", "--config", cfg], capsys), "--lr nan is impossible")


def _config_classes():
    import gptcli

    for m in pkgutil.walk_packages(gptcli.__path__, "gptcli."):
        if ".commands" in m.name or m.name.endswith("__main__"):
            continue
        for name, obj in vars(importlib.import_module(m.name)).items():
            if (
                isinstance(obj, type)
                and dataclasses.is_dataclass(obj)
                and obj.__module__ == m.name
                and name.endswith("Config")
            ):
                yield obj


def test_every_numeric_setting_refuses_nan_and_infinity():
    """Wherever a number appears in a config dataclass, NaN and ±inf are refused — including fields the table has
    no rule for (then they must only be finite)."""
    seen = 0
    for cls in _config_classes():
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if "float" in str(hints[f.name]):
                seen += 1
                for bad in (float("nan"), float("inf"), float("-inf")):
                    with pytest.raises(GPT1Error, match="is impossible"):
                        check_setting(f.name, bad)
    assert seen > 20


def test_every_rule_accepts_the_default_of_every_field_it_governs():
    for cls in _config_classes():
        for f in dataclasses.fields(cls):
            if f.name in RULES and f.default is not dataclasses.MISSING:
                check_setting(f.name, f.default)  # raises if a rule contradicts a default


@pytest.mark.parametrize(
    "name,bad",
    [
        ("seed", SEED_LIMIT),
        ("seed", -1),
        ("batch_size", 0),
        ("n_ctx", 0),
        ("samples", 1025),
        ("top_p", 1.5),
        ("attn_pdrop", 1.0),
        ("master_port", 0),
        ("max_examples", 0),
        ("log_every", 0),
        ("lr", 0.0),
    ],
)
def test_the_rule_is_the_field_s_wherever_it_appears(name, bad):
    with pytest.raises(GPT1Error, match=f"--{name.replace('_', '-')} .* is impossible"):
        check_setting(name, bad)
    with pytest.raises(GPT1Error, match="is impossible"):
        check_setting(f"model.{name}", bad)  # nested (pretraining's model table) too


def test_every_config_built_in_python_is_held_to_its_types():
    """A library user's config is checked as a config file is: a misspelt choice ran another schedule
    (``schedule="Linear"`` was cosine), text for a number failed deep inside (``lr="5e-4"`` in AdamW), a Path for a
    str setting raised AttributeError. Every config class's defaults pass, and a Path is taken for a str."""
    from gptcli.config import check_settings
    from gptcli.train.finetune_config import FinetuneConfig
    from gptcli.train.pretrain_config import PretrainConfig

    dummy = {str: "x", int: 8, float: 1.0, Path: Path("x")}
    for cls in _config_classes():
        hints = typing.get_type_hints(cls)
        required = {
            f.name: dummy.get(hints[f.name], "x")
            for f in dataclasses.fields(cls)
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        }
        check_settings(cls(**required))  # the defaults are of their own types
    for cfg, named in (
        (PretrainConfig(schedule="Linear"), "schedule: expected one of"),
        (PretrainConfig(lr="5e-4"), "lr: expected a number"),
        (FinetuneConfig(task="rte", select="Best"), "select: expected one of 'best', 'last'"),
        (FinetuneConfig(task="rte", layout="pack"), "layout: expected one of"),
    ):
        with pytest.raises(GPT1Error, match=named):
            check_settings(cfg)
    cfg = FinetuneConfig(task="rte", init=Path("runs/pre"))
    check_settings(cfg)
    assert cfg.init == "runs/pre"
