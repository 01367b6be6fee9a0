"""What a fine-tuning run is made of, built before its first update: the task's examples, the pretrained body with
its special tokens, the encoded sequences, and a record of all of it by content (what ``--resume`` compares).

:func:`build_setup` builds it in the order a refusal should come: the task's data (:func:`read_task_data`; a missing
or malformed file fails before any weights are loaded), the device, the body, then the encoding (through the cache).
"""

from __future__ import annotations

import hashlib
import random
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch

from gptcli import checkpoint as ckpt
from gptcli.checkpoint import is_checkpoint, load_checkpoint, read_header, tokenizer_home
from gptcli.config import to_dict
from gptcli.data.cache import encode_cached
from gptcli.data.shards import tokenizer_fingerprint
from gptcli.data.transforms import Encoded
from gptcli.errors import GPT1Error
from gptcli.eval.baselines import label_counts
from gptcli.files.fsutil import sha256_file
from gptcli.model.build import (
    AnyConfig,
    LanguageModel,
    arch_of,
    config_from_dict,
    new_model,
    preset,
    reinit_after,
    with_dropout,
)
from gptcli.model.heads import HeadConfig
from gptcli.model.kernels import prepare as prepare_kernels  # the compiled kernels' first-use build, as a stage
from gptcli.model.lstm import precision_note
from gptcli.progress import Progress
from gptcli.system.runtime import Precision, precision_warning, prepare_device
from gptcli.tasks import ReadOptions, Task
from gptcli.tasks.base import EVAL_SUBSET_SEED, Example, subsample
from gptcli.tokenizers import Tokenizer, load_tokenizer
from gptcli.train.finetune_config import FinetuneConfig
from gptcli.train.run.directory import recorded
from gptcli.train.trainer import Parallel

T = TypeVar("T")


@dataclass
class FinetuneSetup:
    """What one run is made of, fixed before its first update."""

    config: FinetuneConfig
    task: Task
    device: torch.device
    precision: Precision
    data: TaskData
    tokenizer: Tokenizer
    n_ctx: int
    """The longest sequence: ``n_ctx`` if set (at most the model's context), else the model's context."""
    train_enc: list[Encoded]
    dev_enc: list[Encoded]
    head_config: HeadConfig
    source: dict[str, Any]
    """Where the body came from (init checkpoint, its kind and meta, transfer_layers): checkpoint meta."""
    identity: dict[str, Any] = field(default_factory=dict)
    """What the run was made from, by content (:func:`run_identity`), for the resume check; empty for a run that
    cannot resume."""

    @property
    def regression(self) -> bool:
        return self.task.kind == "regression"


def build_setup(
    config: FinetuneConfig, task: Task, par: Parallel, report: Progress
) -> tuple[FinetuneSetup, LanguageModel]:
    """Everything a run is made of, in the order a refusal should come: the task's data first (a missing or malformed
    file fails before any weights are loaded), then the device, the body (seeded: it draws the special tokens'
    rows) and the encoded examples. Returns the setup and the body."""
    splits = (config.train_split, config.eval_split)
    data = read_task_data(
        task,
        config.data_dir,
        splits,
        skip_bad_rows=config.skip_bad_rows,
        max_train=config.max_train_examples,
        max_eval=config.max_eval_examples,
        seed=config.seed,
    )
    device, precision = prepare_device(config.device, config.precision, given=par.device)
    if (warning := precision_warning(precision, device)) is not None:
        report.note(warning, level="warn")
    prepare_kernels(device, report)
    seed_everything(config.seed)
    gpt, tok, source = build_body(
        config.init,
        config.tokenizer,
        model=config.model,
        verify=config.verify,
        transfer_layers=config.transfer_layers,
        dropout=config.dropout,
    )
    if arch_of(gpt.config) == "lstm" and (note := precision_note(device.type, precision)) is not None:
        report.note(note)
    n_ctx = sequence_limit(config.n_ctx, gpt.config.n_ctx)
    train_enc, dev_enc = main_rank_first(
        par,
        config.cache,
        lambda: encode_task_data(
            task, data, tok, n_ctx, splits, cache=config.cache, workers=config.workers, progress=report
        ),
    )
    head = HeadConfig(
        kind=task.kind,
        n_embd=gpt.config.n_embd,
        n_labels=max(1, len(task.labels)),
        extract_id=tok.extract_id,
        pdrop=config.clf_pdrop,
        init_std=gpt.config.init_std,
    )
    setup = FinetuneSetup(config, task, device, precision, data, tok, n_ctx, train_enc, dev_enc, head, source)
    return setup, gpt


def sequence_limit(n_ctx: int | None, model_ctx: int) -> int:
    """The longest sequence: ``n_ctx``, default the model's context. A longer one is refused, not shortened: the run
    would record an ``n_ctx`` its model cannot read (and its encoded-example cache key would name it)."""
    if n_ctx is not None and n_ctx > model_ctx:
        raise GPT1Error(
            f"--n-ctx {n_ctx} exceeds the model's context of {model_ctx} tokens (pass --n-ctx "
            f"{model_ctx} or less, or leave it unset for the model's context)"
        )
    return n_ctx or model_ctx


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


@dataclass
class TaskData:
    """The examples a run trains and scores on, and what reading them left out."""

    train: list[Example]
    dev: list[Example]
    skipped: list[str]
    """Malformed rows skipped with ``skip_bad_rows`` (``path:line: reason``)."""
    excluded: int
    """Rows the dataset's own rule leaves out (SNLI/MNLI ``gold_label == "-"``)."""
    folder: Path
    """The task's data folder."""
    files: dict[str, str]
    """sha256 of every file the splits read, by its path inside ``folder``: hashed when read, for the resume check."""


def read_task_data(
    task: Task,
    data_dir: str | None,
    splits: tuple[str, str] = ("train", "dev"),
    *,
    skip_bad_rows: bool = False,
    max_train: int | None = None,
    max_eval: int | None = None,
    seed: int = 42,
) -> TaskData:
    """The labeled training split and (unless the evaluation split, ``splits[1]``, is empty) the labeled dev split,
    subsampled (the training examples with ``seed``), with the bad rows skipped (``path:line: reason``), the count
    of rows the dataset's own rule leaves out (SNLI/MNLI ``gold_label == "-"``) and the sha256 of every file read."""
    train_split, eval_split = splits
    opts = ReadOptions(skip_bad_rows=skip_bad_rows, skippable=True)
    train = task.read(train_split, data_dir, opts)
    unlabeled = sum(e.label is None for e in train)
    if unlabeled:
        raise GPT1Error(f"{task.name}: split {train_split!r} has {unlabeled} unlabeled rows; cannot train on it")
    skipped, excluded = opts.skipped, len(getattr(opts, "excluded", []))
    dev: list[Example] = []
    if eval_split:
        dev_opts = ReadOptions(skip_bad_rows=skip_bad_rows, skippable=True)
        dev = task.read(eval_split, data_dir, dev_opts)
        skipped += dev_opts.skipped
        excluded += len(getattr(dev_opts, "excluded", []))
        if any(e.label is None for e in dev):
            raise GPT1Error(f"{task.name}: split {eval_split!r} is unlabeled; choose a labeled --eval-split")
    train = subsample(train, max_train, seed)
    # The dev subset is drawn as `gpt1 eval --max-examples` draws it (it drew with seed + 1 before: a run's dev score
    # and eval's were on different examples, and runs of different seeds on different dev subsets).
    dev = subsample(dev, max_eval, EVAL_SUBSET_SEED)
    if not train:
        raise GPT1Error(f"{task.name}: no training examples in split {train_split!r}")
    folder = task.data_dir(data_dir)
    files: dict[str, str] = {}
    for split in dict.fromkeys(s for s in splits if s):
        for name in task.splits[split].files:
            top = folder / name
            for f in sorted(top.rglob("*")) if top.is_dir() else [top]:
                if f.is_file():
                    files[f.relative_to(folder).as_posix()] = sha256_file(f)
    return TaskData(train, dev, skipped, excluded, folder, files)


def _tokenizer_source(path: str) -> tuple[Path, AnyConfig | None]:
    """Where ``--tokenizer`` finds its tokenizer directory (:func:`gptcli.checkpoint.tokenizer_home`), with the model
    config of a checkpoint or run directory (so a random model can have its shape; a tokenizer directory or a
    prepared corpus: None)."""
    p = Path(path)
    home = tokenizer_home(p)
    if home == p or not (is_checkpoint(p) or (p / "checkpoints").is_dir()):  # no model config comes with it
        if home is None:
            raise GPT1Error(
                f"{p}: not a tokenizer directory, prepared corpus, checkpoint or run directory (pass one "
                "of those to --tokenizer)"
            )
        return home, None
    header = read_header(p)
    if home is None:
        raise GPT1Error(
            f"{header.path}: checkpoint has no tokenizer/ (pass a tokenizer directory or a prepared "
            "corpus to --tokenizer)"
        )
    mcfg = config_from_dict(header.arch, header.model)
    mcfg.n_special = 0
    return home, mcfg


def _load_tokenizer_from(path: str) -> tuple[Tokenizer, AnyConfig | None]:
    """The tokenizer ``--tokenizer`` names (:func:`_tokenizer_source`) and the model config it comes with."""
    where, mcfg = _tokenizer_source(path)
    return load_tokenizer(where), mcfg


def _check_same_tokenizer(tokenizer: str, init: Path) -> None:
    """Refuse a ``--tokenizer`` other than the pretrained checkpoint's own: the model's embeddings were learned for
    its ids, and another tokenizer's ids (even of the same vocabulary size) would silently train nonsense."""
    where, _ = _tokenizer_source(tokenizer)
    if tokenizer_fingerprint(where) != tokenizer_fingerprint(init / ckpt.TOKENIZER):
        raise GPT1Error(
            f"--tokenizer {tokenizer} is another tokenizer than the checkpoint {init}'s "
            f"({where} differs from {init / ckpt.TOKENIZER}; drop --tokenizer to use the checkpoint's own, or pass "
            "--init none to train from scratch with this tokenizer)"
        )


def build_body(
    init: str,
    tokenizer: str | None = None,
    *,
    model: str = "gpt1",
    verify: bool = True,
    transfer_layers: int | None = None,
    dropout: float | None = None,
) -> tuple[LanguageModel, Tokenizer, dict[str, Any]]:
    """The GPT body with its three special tokens, the tokenizer, and a description of where it came from: the
    checkpoint ``init`` (verified unless ``verify`` is off), or with ``init="none"`` a new ``model`` preset (or the
    shape of the checkpoint ``tokenizer`` names); its layers after ``transfer_layers`` re-initialised, its dropouts
    set to ``dropout``."""
    n_sp = 3
    if init.lower() == "none":
        if not tokenizer:
            raise GPT1Error(
                "--init none needs --tokenizer DIR (a tokenizer directory or a checkpoint) to encode the task"
            )
        tok, mcfg = _load_tokenizer_from(tokenizer)
        if mcfg is None:
            try:
                mcfg = preset(model, vocab_size=tok.vocab_size)
            except KeyError as e:
                raise GPT1Error(f"--model: {e.args[0]}") from None
        mcfg.vocab_size = tok.vocab_size
        gpt = new_model(mcfg)
        source: dict[str, Any] = {"init": "none", "tokenizer": str(tokenizer)}
    else:
        if not init:
            raise GPT1Error("no checkpoint to fine-tune: pass --init CHECKPOINT (or --init none for no pretraining)")
        ck = load_checkpoint(init, verify=verify)
        weights_sha = ck.weights_sha256()  # what a resume compares the init checkpoint by
        gpt = ck.model
        found: Tokenizer | None = ck.tokenizer
        if tokenizer and found is None:  # the checkpoint has none: --tokenizer gives it
            found, _ = _load_tokenizer_from(tokenizer)
        elif tokenizer:
            _check_same_tokenizer(tokenizer, ck.path)  # the same one by content: nothing to load twice
        if found is None:
            raise GPT1Error(f"{ck.path}: checkpoint has no tokenizer/ (pass --tokenizer DIR)")
        tok = found
        n_sp = max(0, 3 - gpt.config.n_special)
        source = {"init": str(ck.path), "init_kind": ck.kind, "init_meta": ck.meta, "init_sha256": weights_sha}
    if tok.vocab_size != gpt.config.vocab_size:
        raise GPT1Error(
            f"tokenizer has {tok.vocab_size} ids but the model's vocabulary has {gpt.config.vocab_size}: "
            "they must come from the same pretraining run"
        )
    gpt.add_special_tokens(n_sp)  # start, delimiter, extract: new rows drawn from N(0, 0.02)
    if transfer_layers is not None and init.lower() != "none":
        try:
            reinit_after(gpt, transfer_layers)
        except ValueError:  # its range is reinit_after's rule; said here in the option's words
            raise GPT1Error(
                f"--transfer-layers must be between 0 and {gpt.config.n_layer} (the model's layers), "
                f"got {transfer_layers}"
            ) from None
        source["transfer_layers"] = transfer_layers
    if dropout is not None:
        gpt = with_dropout(gpt, dropout)
    return gpt, tok, source


def encode_task_data(
    task: Task,
    data: TaskData,
    tok: Tokenizer,
    n_ctx: int,
    splits: tuple[str, str] = ("train", "dev"),
    *,
    cache: bool = True,
    workers: int = 0,
    progress: Progress | None = None,
) -> tuple[list[Encoded], list[Encoded]]:
    """The training and dev examples encoded (through the encoding cache unless ``cache`` is off, over ``workers``
    processes; ``splits`` name them in the progress report): the same ids whichever way they were obtained, so the
    run is the same."""
    opts: dict[str, Any] = dict(cache=cache, workers=workers, progress=progress)
    train_enc = encode_cached(task, data.train, tok, n_ctx, what=f"{task.name} {splits[0]}", **opts)
    dev_enc = encode_cached(task, data.dev, tok, n_ctx, what=f"{task.name} {splits[1]}", **opts) if data.dev else []
    return train_enc, dev_enc


def main_rank_first(par: Parallel, cache: bool, work: Callable[[], T]) -> T:
    """``work()`` (encoding through the cache) on rank 0 first and then on the other ranks, which read what rank 0
    stored instead of racing it to write the same entries. Without the cache every rank encodes for itself."""
    if par.world_size == 1 or not cache:
        return work()
    if par.is_main:
        done = work()
        par.barrier()
        return done
    par.barrier()  # waits out rank 0's encoding: a cold MNLI can take minutes (GPT1_DIST_TIMEOUT bounds the wait)
    return work()


def run_identity(setup: FinetuneSetup) -> dict[str, Any]:
    """What the run is made of, by content, recorded in every step checkpoint: the data files read (sha256 each,
    by path inside the task folder: :attr:`TaskData.files`), the init checkpoint's weights, and the encoded examples
    (which the tokenizer, the truncation and the subsets decide)."""
    h = hashlib.sha256()
    for e in [*setup.train_enc, None, *setup.dev_enc]:  # about 1 s for MNLI's 393k pairs
        if e is None:
            h.update(b"|dev|")
            continue
        for seq in e.seqs:  # length-prefixed, so the boundaries are part of what is hashed
            h.update(len(seq).to_bytes(4, "little") + array("q", seq).tobytes())
        h.update(repr(e.label).encode() + b";")
    return {
        "data_dir": str(setup.data.folder.resolve()),
        "data_files": setup.data.files,
        "init_sha256": setup.source.get("init_sha256"),
        "examples_sha256": h.hexdigest(),
    }


def changed_data(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Each data file whose content differs from the one the run started with (the folder may have moved)."""
    was, now = old.get("data_files", {}), new.get("data_files", {})
    differ = [f for f in sorted(set(was) | set(now)) if was.get(f) != now.get(f)]
    if not differ:
        return []
    if old.get("data_dir") != new.get("data_dir"):
        return [f"data {old.get('data_dir', '?')} → {new['data_dir']} (other files: {', '.join(differ)})"]
    return [f"data file {f} ({'changed since the run started' if f in now else 'no longer read'})" for f in differ]


def checkpoint_meta(setup: FinetuneSetup, epoch: int, step: int, dev_scores: dict[str, Any]) -> dict[str, Any]:
    """What a fine-tuned checkpoint says about itself (``gpt1 eval`` reads the task, head and context here)."""
    c, task = setup.config, setup.task
    return {
        "task": task.name,
        "kind": task.kind,
        "labels": list(task.labels),
        "head": setup.head_config.to_dict(),
        "n_ctx": setup.n_ctx,
        "epoch": epoch,
        "step": step,
        "select": c.select,
        "dev_split": c.eval_split,
        "dev_scores": dev_scores,
        "train_label_counts": label_counts(task, setup.data.train),  # gpt1 eval's majority level comes from these
        "finetune_config": to_dict(recorded(c)),
        **setup.source,
    }
