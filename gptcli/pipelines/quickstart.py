"""The whole GPT-1 pipeline at toy scale, offline, in a few minutes: ``quickstart(QuickstartConfig())``.

The paper's recipe (Radford et al. 2018, §3): generative pre-training of a Transformer language model on
unlabeled text, then discriminative fine-tuning on a labeled task with an auxiliary LM loss (§3.2), and its
zero-shot heuristics (§5, Figure 2 right). Each stage is one function, run in order, and each calls the real
library function the full-scale commands use, so a newcomer sees the same code paths a full run takes:
:func:`collect_text` (the standard library's docstrings, nothing downloaded), :func:`prepare_corpus`,
:func:`pretrain_model`, :func:`finetune_model` (original vs word-shuffled sentences), :func:`evaluate_model` and
:func:`zeroshot_models`; then :func:`write_summary` writes ``summary.json`` (:func:`quickstart` says more).

Everything goes under ``config.out``, marked as a quickstart (:mod:`gptcli.files.outputs`); an earlier quickstart
there is replaced only with ``overwrite``, and kept aside until this run has finished (:func:`check_out`,
:func:`_replacing`). ``minutes`` is one budget for every stage (:class:`gptcli.pipelines.budget.Deadline`).
"""

from __future__ import annotations

import contextlib
import json
import math
import shutil
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from gptcli.errors import GPT1Error
from gptcli.files.fsutil import write_text_atomic
from gptcli.files.locks import output_lock
from gptcli.files.outputs import OWNED, check_output, foreign_entries, mark
from gptcli.model.kernels import apply as apply_kernels
from gptcli.model.kernels import config_default
from gptcli.pipelines import budget
from gptcli.pipelines.stdlib_text import hold_out, stdlib_documents, stdlib_root
from gptcli.pipelines.summary import LEARNING_UPDATES, WHAT_NEXT, summary_rows
from gptcli.progress import SILENT, Progress

# What quickstart writes under its output directory (``overwrite`` replaces exactly these).
OUTPUTS = OWNED["quickstart"]  # what a quickstart writes in --out, listed once (gptcli/files/outputs.py)
# The hidden folder an earlier quickstart waits in while a new one runs over it.
OLD_PREFIX = ".quickstart-old-"

STAGES: tuple[tuple[str, str], ...] = (
    ("text", "Collect text: docstrings of the Python standard library"),
    ("prepare", "Prepare: text pipeline → learned BPE → token shards"),
    ("pretrain", "Pretrain: generative pre-training of a tiny GPT"),
    ("finetune", "Fine-tune: original vs word-shuffled sentences (CoLA-style)"),
    ("eval", "Evaluate the fine-tuned model on the held-out test split"),
    ("zeroshot", "Zero-shot: the paper's CoLA heuristic, before and after pretraining"),
)
"""``(key, title)`` of each stage, in order; the progress stage of the i-th is named ``"i/6 title"``."""
MIN_FINETUNE_SECONDS = 10.0
"""What fine-tuning gets when the budget is spent: enough for a few updates and a dev score."""
TICK_SECONDS = 5.0
"""How often a long step without progress of its own (the kernels' compile) reports its elapsed time."""

T = TypeVar("T")


@dataclass
class QuickstartConfig:
    """Settings of ``gpt1 quickstart``. The defaults run in at most ``minutes`` on a 2-core laptop CPU."""

    out: Path = Path("runs/quickstart")
    """Output directory (text, task files, corpus, runs, summary.json)."""
    minutes: float = 4.0
    """Wall-clock target for the whole run; pretraining gets what the other stages leave, up to ``max_epochs``."""
    seed: int = 0
    """Seeds the held-out modules, the task, the BPE sample, initialisation and data order."""
    overwrite: bool = False
    """Replace the outputs of an earlier quickstart in ``out``, kept until the new run has finished (anything else
    there is refused, never deleted)."""
    device: str = "auto"
    """auto | cpu | cuda."""
    precision: str = "auto"
    """auto | fp32 | bf16 | fp16 (auto: bf16 on CUDA and on CPUs with native bf16)."""
    kernels: str = field(default_factory=config_default)
    """How the model is computed, not what: auto = the fast CPU kernels of gptcli/model/kernels on CPU (PyTorch's
    fused ones elsewhere); reference = plain PyTorch everywhere (SDPA, F.dropout, F.cross_entropy). Default: the
    process's mode when the config is made ($GPT1_KERNELS, else auto)."""
    workers: int = 0
    """Worker processes for the text pipeline (0 = all cores)."""
    stdlib: Path | None = None
    """Folder of .py files to read docstrings from (default: this Python's standard library)."""
    max_modules: int | None = None
    """Use only the first N modules (quick tests)."""
    task_fraction: float = 0.35
    """Share of the modules held out from pretraining; their prose sentences make the toy task."""
    vocab_size: int = 3000
    """BPE vocabulary learned by prepare (GPT-1: 40,478)."""
    model: dict[str, Any] = field(
        default_factory=lambda: {
            "n_layer": 3,
            "n_embd": 192,
            "n_head": 4,
            "n_inner": 768,
            "n_ctx": 128,
            "embd_pdrop": 0.0,
            "attn_pdrop": 0.0,
            "resid_pdrop": 0.0,
            "init_std": 0.06,
        }
    )
    """Overrides of the ``tiny`` preset (4 layers × 256): smaller still, so that minutes of CPU teach it something;
    no dropout (GPT-1: 0.1), which only slows learning in a run that sees its data a few times; and a wider
    initialisation than GPT-1's N(0, 0.02) (sized for 768 dimensions), at which a model this small stays at the
    unigram loss for far longer than the quickstart runs (docs/quickstart.md)."""
    seq_len: int = 128
    """Pretraining sequence length (GPT-1: 512)."""
    batch_size: int = 16
    """Pretraining sequences per update (GPT-1: 64)."""
    lr: float = 2e-3
    """Peak pretraining learning rate (GPT-1: 2.5e-4 for a 116M model; a tiny model takes a larger one)."""
    pretrain_steps: int | None = None
    """Fixed number of pretraining updates instead of filling the budget (tests, reproducible runs)."""
    max_epochs: float = 8.0
    """Cap on passes over the pretraining corpus when the machine is fast. Measured (seeds 0-2, fixed numbers of
    updates, docs/quickstart.md): validation perplexity is lowest at 8 passes (104-107; 105-113 at 10) and rises
    past them as the small model learns the docstrings by heart (117 at 13, 142 at 16, 197-262 at 20)."""
    eval_batches: int = 16
    """Validation batches for perplexity (before and after pretraining)."""
    finetune_lr: float = 5e-4
    """Fine-tuning learning rate (GPT-1: 6.25e-5; again, the tiny model takes a larger one)."""
    finetune_epochs: int = 3
    """Fine-tuning epochs (GPT-1: 3)."""
    finetune_batch_size: int = 32
    """Fine-tuning examples per update (GPT-1: 32)."""
    max_train_examples: int | None = None
    """Cap on the task's training examples (quick tests)."""
    zeroshot_fit_examples: int = 600
    """Training examples the zero-shot threshold is fitted on (the paper fits CoLA's on its train split)."""


@dataclass
class QuickstartResult:
    out: Path
    numbers: dict[str, Any]
    """The final figures (also in ``summary.json``): see :func:`summary_rows` for what each one means."""
    seconds: dict[str, float]
    """Wall-clock seconds per stage."""
    paths: dict[str, str]


# --------------------------------------------------------------------------------------------------- output


def check_out(cfg: QuickstartConfig) -> Path:
    """``cfg.out`` if quickstart may write there: new, empty, or an earlier quickstart (with ``overwrite``).
    A folder holding anything quickstart did not write, or another kind of gpt1 output, is refused."""
    out = Path(cfg.out)
    if out.is_dir():
        foreign = foreign_entries(out, "quickstart")  # its outputs, marker and leftovers: outputs.OWNED
        if foreign:
            raise GPT1Error(
                f"{out}: holds files quickstart did not write ({', '.join(foreign[:5])}); "
                "refusing to overwrite it (choose another --out)"
            )
    check_output(out, "quickstart", overwrite=True, inputs=[stdlib_root(cfg.stdlib)])
    # An unfinished quickstart (killed before its summary was written) is nothing to keep: run again over it.
    if out.is_dir() and any(out.iterdir()) and not cfg.overwrite and (out / "summary.json").exists():
        raise GPT1Error(
            f"{out}: directory is not empty; pass --overwrite to replace an earlier quickstart there "
            "or choose another --out"
        )
    return out


@contextlib.contextmanager
def _replacing(out: Path) -> Iterator[Path]:
    """``out``, marked as a quickstart and empty for this run. An earlier quickstart there is moved into a hidden
    folder inside it first and deleted once this run has finished; if this run fails or is interrupted, what it
    wrote is removed and the earlier one put back, so it is never lost to a run that did not finish (and a first
    run leaves nothing behind)."""
    old, existed = None, out.is_dir()
    if out.is_dir() and any(out.iterdir()):
        old = out / f"{OLD_PREFIX}{uuid.uuid4().hex[:8]}"
        old.mkdir()
        for p in list(out.iterdir()):
            if p != old and not p.name.startswith(OLD_PREFIX):
                p.rename(old / p.name)
    out.mkdir(parents=True, exist_ok=True)
    mark(out, "quickstart")
    try:
        yield out
    except BaseException:
        # Nothing half-written stays: what this run wrote goes, and the folder is as it was (an earlier
        # quickstart put back, an empty folder left empty, a new one removed).
        _remove(p for p in out.iterdir() if p != old and not p.name.startswith(OLD_PREFIX))
        if old is not None:
            for p in list(old.iterdir()):
                p.rename(out / p.name)
            old.rmdir()
        elif not existed:
            out.rmdir()
        raise
    _remove(p for p in out.iterdir() if p.name.startswith(OLD_PREFIX))


def _remove(paths: Iterable[Path]) -> None:
    for p in list(paths):
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        else:
            p.unlink()


# --------------------------------------------------------------------------------------------------- the run


@dataclass
class _Stages:
    """What the pipeline's stages share: the settings, where everything goes, and the figures collected so far. Not a
    training run's state: the two runs inside the pipeline are ``pretrain()`` and ``finetune()``, each on the run
    machinery every training run shares (:mod:`gptcli.train.run`)."""

    cfg: QuickstartConfig
    out: Path
    progress: Progress
    t_start: float
    """``time.perf_counter()`` when the run began (its ``seconds_total``)."""
    deadline: budget.Deadline
    """The run's ``minutes``, counted from the same moment: what every stage's share comes from."""
    numbers: dict[str, Any]
    seconds: dict[str, float] = field(default_factory=dict)
    paths: dict[str, str] = field(default_factory=dict)
    update_s: float = 0.0
    """Seconds per pretraining update as timed here: the unit the later stages' costs are estimated in."""


@dataclass
class TaskText:
    """Stage 1's output: the pretraining text and the toy task made from the held-out modules."""

    corpus_file: Path
    task_dir: Path
    splits: dict[str, list[Any]]
    """``shuffled.Row``s per split (train, dev, test)."""


@dataclass
class Pretrained:
    """Stage 3's output: the pretrained checkpoint and the untrained model it started from (for zero-shot)."""

    checkpoint: Path
    init_model: Any
    tokenizer: Any
    device: Any
    precision: str


def quickstart(config: QuickstartConfig, progress: Progress | None = None) -> QuickstartResult:
    """Run every stage as configured; returns the numbers of the final table. Raises GPT1Error on user errors.

    The stages:

    1. :func:`collect_text` — the English text that ships with every Python installation: the docstrings of the
       standard library (module, class and function docstrings read with :mod:`ast`, one document per module, in path
       order; nothing is downloaded and nothing is copied into the repository: :mod:`gptcli.pipelines.stdlib_text`).
       A seeded share of the modules is held out: their prose sentences become the toy task, the rest is the
       pretraining corpus.
    2. :func:`prepare_corpus` — :func:`gptcli.data.prepare.prepare` with a small learned BPE vocabulary.
    3. :func:`pretrain_model` — :func:`gptcli.train.pretrain.pretrain` of the ``tiny`` preset shrunk further, for as
       many updates as fit the time budget (the update time is timed first: :mod:`gptcli.pipelines.budget`), with
       the paper's warmup + cosine schedule.
    4. :func:`finetune_model` — :func:`gptcli.train.finetune.finetune` on "original vs word-shuffled sentence"
       (:mod:`gptcli.tasks.shuffled`, CoLA's format and metric), auxiliary LM loss included.
    5. :func:`evaluate_model` — :func:`gptcli.eval.tasks.evaluate_task` on the held-out test split, against the
       majority class.
    6. :func:`zeroshot_models` — the paper's CoLA heuristic (:func:`gptcli.eval.zeroshot.cola`): average token
       log-probability, thresholded on the train split, scored on the test split, for the model before and after
       pretraining.

    Budget: pretraining gets what is left after preparing minus an estimate of the later stages, up to
    ``max_epochs`` passes over its corpus, and fine-tuning what pretraining left minus the scoring's estimate, each as
    a hard time limit of its run. A stage the budget starved says so, and the summary marks its figures as
    meaningless rather than presenting them. The CPU kernels' one-time compile comes before the clock, with its
    elapsed time shown. Progress: each numbered stage is one ``stage(title)`` … ``end(summary)``, and the library
    functions it calls report inside it.
    """
    from gptcli.config import save_config
    from gptcli.model.kernels import prepare, use_kernels
    from gptcli.system.runtime import resolve_device
    from gptcli.tasks import shuffled

    cfg = config
    _check(cfg)
    # Every stage's model runs in cfg.kernels (the pretraining and fine-tuning configs say it too); the caller's
    # mode is back afterwards.
    with use_kernels(cfg.kernels), output_lock(cfg.out), _replacing(check_out(cfg)) as out:
        # The compiled CPU kernels' one-time build (about a minute on 2 cores) comes before the clock starts: the
        # time budget is the pipeline's, so a machine's first run pretrains as long as every later one.
        with _ticking(progress or SILENT, TICK_SECONDS):  # minutes of compiling on a first run: show that it is alive
            prepare(resolve_device(cfg.device), progress or SILENT)
        t_start, deadline = time.perf_counter(), budget.Deadline(60.0 * cfg.minutes)
        save_config(cfg, out / "config.toml")
        numbers = {"minutes_budget": cfg.minutes, "seed": cfg.seed}
        run = _Stages(cfg, out, progress or SILENT, t_start, deadline, numbers)
        text = _stage(run, "text", collect_text, run)
        corpus_dir = _stage(run, "prepare", prepare_corpus, run, text)
        pre = _stage(run, "pretrain", pretrain_model, run, text, corpus_dir)
        with shuffled.registered():  # the toy task is a task like the paper's only for these three stages
            checkpoint = _stage(run, "finetune", finetune_model, run, text, pre)
            _stage(run, "eval", evaluate_model, run, text, checkpoint)
            _stage(run, "zeroshot", zeroshot_models, run, text, pre)
        return write_summary(run)


@contextlib.contextmanager
def _ticking(progress: Progress, every: float = 5.0) -> Iterator[None]:
    """Report the elapsed seconds to the current stage every ``every`` seconds while the block runs: a long step
    with no progress of its own (the compile of the CPU kernels) still shows that it moves."""
    done = threading.Event()
    t0 = time.perf_counter()

    def tick() -> None:
        while not done.wait(every):
            progress.advance(0, elapsed=f"{time.perf_counter() - t0:.0f} s")

    thread = threading.Thread(target=tick, name="quickstart-ticker", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def _stopped(what: str, signal_name: str) -> GPT1Error:
    """A run inside the quickstart stopped by a signal: the quickstart is all or nothing, so it ends, nothing kept,
    with the signal's exit status (130 for Ctrl-C) as any interrupted command."""
    err = GPT1Error(f"{what} stopped by {signal_name}: the quickstart kept nothing (run it again)")
    number = getattr(signal.Signals, signal_name, None)
    err.exit_code = 128 + int(number) if number is not None else 130
    return err


def _check(cfg: QuickstartConfig) -> None:
    from gptcli.config import check_settings
    from gptcli.train.pretrain_config import model_overrides

    check_settings(cfg)  # one rule per number, the same in every command (gptcli.config.RULES)
    # The [model] table typed against the tiny preset's fields, as pretraining does, before stage 1 rather than 3.
    model_overrides(_pretrain_config(cfg, Path(), Path()))
    if cfg.minutes <= 0:
        raise GPT1Error(f"--minutes must be positive, got {cfg.minutes}")
    if not 0.05 <= cfg.task_fraction <= 0.8:
        raise GPT1Error(f"task_fraction must be in [0.05, 0.8], got {cfg.task_fraction}")


def _stage(run: _Stages, key: str, body: Callable[..., tuple[T, str]], *args: Any) -> T:
    """Run one numbered stage: ``body(*args)`` returns (what the next stages need, a one-line summary)."""
    keys = [k for k, _ in STAGES]
    run.progress.stage(f"{keys.index(key) + 1}/{len(STAGES)} {dict(STAGES)[key]}")
    t0 = time.perf_counter()
    try:
        value, summary = body(*args)
    except BaseException:
        run.progress.end()
        raise
    run.seconds[key] = round(time.perf_counter() - t0, 2)
    run.progress.end(summary)
    return value


def collect_text(run: _Stages) -> tuple[TaskText, str]:
    """Stage 1: standard-library docstrings → the pretraining text (JSONL) and the toy task's files."""
    from gptcli.tasks import shuffled

    cfg = run.cfg
    docs = stdlib_documents(cfg.stdlib, cfg.max_modules)
    train_docs, held_docs = hold_out(docs, cfg.task_fraction, cfg.seed)
    text_dir = run.out / "text"
    text_dir.mkdir()
    corpus_file = text_dir / "stdlib-docstrings.jsonl"
    with open(corpus_file, "w", encoding="utf-8") as f:
        for module, text in train_docs:
            f.write(json.dumps({"module": module, "text": text}, ensure_ascii=False) + "\n")
    n_sentences, splits = task_splits(train_docs, held_docs, cfg)
    task_dir = shuffled.write_task_files(splits, run.out / "task")
    n_chars = sum(len(t) for _, t in train_docs)
    run.numbers.update(
        modules=len(docs),
        pretrain_modules=len(train_docs),
        task_modules=len(held_docs),
        pretrain_chars=n_chars,
        **{f"task_{k}": len(v) for k, v in splits.items()},
    )
    run.paths.update(text=str(corpus_file), task=str(task_dir))
    return TaskText(corpus_file, task_dir, splits), (
        f"{len(train_docs)} modules ({n_chars / 1e6:.2f} M characters) for pretraining; "
        f"{len(held_docs)} held out → {n_sentences:,} task sentences, as written and shuffled: "
        f"{len(splits['train'])}/{len(splits['dev'])}/{len(splits['test'])} train/dev/test examples"
    )


def task_splits(
    train_docs: list[tuple[str, str]], held_docs: list[tuple[str, str]], cfg: QuickstartConfig
) -> tuple[int, dict[str, list[Any]]]:
    """The toy task's rows per split from the held-out modules' prose, and how many sentences they came from."""
    from gptcli.tasks import shuffled

    # Docstrings repeat across modules (e.g. decimal and _pydecimal): a sentence that also occurs anywhere in the
    # pretraining text is not held out, so it is left out of the task.
    seen_text = " ".join(" ".join(t.split()) for _, t in train_docs).lower()
    sentences = [(m, s) for m, text in held_docs for s in shuffled.prose_sentences(text) if s.lower() not in seen_text]
    groups = shuffled.make_rows(sentences, cfg.seed)
    splits = shuffled.split_rows(groups)
    if cfg.max_train_examples is not None:
        splits["train"] = splits["train"][: cfg.max_train_examples]
    if min(len(v) for v in splits.values()) < 4:
        raise GPT1Error(
            f"only {len(groups)} prose sentences in the held-out modules: too few for the task "
            "(use more modules or a larger task_fraction)"
        )
    return len(groups), splits


def prepare_corpus(run: _Stages, text: TaskText) -> tuple[Path, str]:
    """Stage 2: the pretraining text → a corpus of token shards with a learned BPE vocabulary."""
    from gptcli.data.prepare import PrepareConfig, prepare

    cfg = run.cfg
    corpus_dir = run.out / "corpus"
    pc = PrepareConfig(
        inputs=[str(text.corpus_file)],
        out=corpus_dir,
        vocab_size=cfg.vocab_size,
        val_fraction=0.05,
        seed=cfg.seed,
        workers=cfg.workers,
    )
    prep = prepare(pc, progress=run.progress)
    st = prep.manifest["splits"]
    run.numbers.update(train_tokens=st["train"]["tokens"], val_tokens=st["val"]["tokens"], vocab_size=cfg.vocab_size)
    run.paths["corpus"] = str(corpus_dir)
    return corpus_dir, (
        f"{st['train']['tokens']:,} training and {st['val']['tokens']:,} validation tokens, "
        f"vocabulary {cfg.vocab_size:,}"
    )


def pretrain_model(run: _Stages, text: TaskText, corpus_dir: Path) -> tuple[Pretrained, str]:
    """Stage 3: validation perplexity of the untrained model, the budget's number of updates, pretraining."""
    import torch

    from gptcli.data.shards import open_corpus
    from gptcli.eval.perplexity import evaluate_lm
    from gptcli.model.build import build_model
    from gptcli.system.runtime import resolve_device, resolve_precision
    from gptcli.train.pretrain import pretrain
    from gptcli.train.pretrain_config import build_model_config

    cfg = run.cfg
    device = resolve_device(cfg.device)
    precision = resolve_precision(cfg.precision, device)
    pc = _pretrain_config(cfg, corpus_dir, run.out / "pretrain")
    corpus = open_corpus(corpus_dir)
    mcfg = build_model_config(pc, corpus.tokenizer.vocab_size)
    val_arrays = corpus.arrays("val")
    torch.manual_seed(cfg.seed)  # the same initial weights pretrain() draws
    init_model = build_model(mcfg).to(device)
    apply_kernels(init_model, device)  # in place, as every run's model
    before = evaluate_lm(
        init_model,
        val_arrays,
        cfg.seq_len,
        cfg.batch_size,
        device=device,
        precision=precision,
        max_batches=cfg.eval_batches,
    )
    step_s = _plan_updates(run, text, pc, mcfg, device, precision, before.perplexity)
    res = pretrain(pc, progress=run.progress)
    if res.stopped_by:
        raise _stopped("pretraining", res.stopped_by)
    if res.final_val_loss is None or res.last_checkpoint is None:
        raise GPT1Error(f"{pc.out}: pretraining stopped early ({res.stopped_by or 'no validation split'})")
    after_ppl = math.exp(min(res.final_val_loss, 700))
    if res.step < res.total_steps:  # the deadline stopped it (pretrain() warned with the numbers)
        run.numbers["pretrain_stopped_at_deadline"] = True
        run.progress.note(
            f"pretraining stopped at the quickstart's deadline after {res.step} of {res.total_steps} "
            f"planned updates: this machine ran slower than the timed updates promised (other "
            f"processes?); the quickstart keeps to its {cfg.minutes:g} minutes",
            level="warn",
        )
    run.numbers["pretrain_starved"] = cfg.pretrain_steps is None and res.step < LEARNING_UPDATES
    if run.numbers["pretrain_starved"]:
        run.progress.note(
            f"the budget left pretraining {res.step} updates, fewer than the {LEARNING_UPDATES} this model needs "
            f"to learn anything: its perplexity and zero-shot figures mean nothing (give --minutes more)",
            level="warn",
        )
    run.numbers.update(
        pretrain_steps=res.step,
        update_ms=round(1000 * step_s, 1),
        pretrain_tokens=res.step * cfg.batch_size * cfg.seq_len,
        val_ppl_before=before.perplexity,
        val_ppl_after=after_ppl,
        params=sum(p.numel() for p in init_model.parameters()),
    )
    run.paths["pretrain"] = str(res.last_checkpoint)
    pre = Pretrained(res.last_checkpoint, init_model, corpus.tokenizer, device, precision)
    starved = " (starved by the time budget: these figures mean nothing)" if run.numbers["pretrain_starved"] else ""
    return pre, f"{res.step} updates; validation perplexity {before.perplexity:,.1f} → {after_ppl:,.1f}{starved}"


def _pretrain_config(cfg: QuickstartConfig, corpus_dir: Path, run_dir: Path) -> Any:
    from gptcli.train.pretrain import PretrainConfig

    return PretrainConfig(
        data=corpus_dir,
        out=run_dir,
        preset="tiny",
        model=dict(cfg.model),
        seq_len=cfg.seq_len,
        batch_size=cfg.batch_size,
        lr=cfg.lr,
        seed=cfg.seed,
        device=cfg.device,
        precision=cfg.precision,
        kernels=cfg.kernels,
        eval_every=0,
        eval_batches=cfg.eval_batches,
        save_every=0,
        keep_last=1,
    )


def _plan_updates(
    run: _Stages, text: TaskText, pc: Any, mcfg: Any, device: Any, precision: str, ppl_before: float
) -> float:
    """Time one update here, size pretraining to the budget (or ``pretrain_steps``), set ``pc``'s schedule;
    returns the seconds per update."""
    cfg = run.cfg
    train_tokens = run.numbers["train_tokens"]
    step_s = budget.time_update(mcfg, cfg.seq_len, cfg.batch_size, device, precision)
    if cfg.pretrain_steps is not None:
        steps = max(1, cfg.pretrain_steps)
    else:
        cap = int(cfg.max_epochs * budget.updates_per_epoch(train_tokens, cfg.batch_size, cfg.seq_len))
        later = _finetune_seconds(cfg, text.splits, step_s) + _scoring_seconds(cfg, text.splits, step_s)
        for_pretraining = run.deadline.left() - later
        steps = budget.updates_that_fit(for_pretraining, step_s, minimum=20, maximum=cap)
        # The plan comes from a few timed updates; a machine that gets busier meanwhile (other processes) would
        # overrun it. The deadline holds whatever happens: pretraining stops there, validated and saved, and says so.
        pc.max_minutes = max(for_pretraining, 20 * step_s) / 60.0
    run.update_s = step_s
    pc.max_steps = steps
    pc.warmup_steps = max(1, steps // 20)
    pc.log_every = max(1, steps // 20)
    run.progress.note(
        f"one update of {cfg.batch_size}×{cfg.seq_len} tokens takes {step_s * 1000:.0f} ms here → {steps} updates "
        f"(~{steps * step_s:.0f} s, {budget.epochs(steps, cfg.batch_size, cfg.seq_len, train_tokens):.1f} epochs); "
        f"validation perplexity before pretraining {ppl_before:,.1f}"
    )
    return step_s


# What the later stages will cost, in seconds of pretraining updates: about this many training tokens' worth of
# updates (fine-tuning ~1.5× per token for its short padded batches; evaluation and zero-shot scoring forward-only,
# ~⅓), plus a few fixed seconds.
def _task_tokens(splits: dict[str, list[Any]]) -> tuple[float, float]:
    """The task's training tokens (about 1.4 per word, plus the delimiters) and their average per example."""
    n = sum(len(r.sentence.split()) * 1.4 + 2 for r in splits["train"])
    return n, n / max(1, len(splits["train"]))


def _finetune_seconds(cfg: QuickstartConfig, splits: dict[str, list[Any]], step_s: float) -> float:
    """What fine-tuning (its updates and its dev scores) will cost."""
    n, avg = _task_tokens(splits)
    tokens = 1.5 * cfg.finetune_epochs * n + 0.35 * avg * cfg.finetune_epochs * len(splits["dev"])
    return budget.seconds_for_tokens(tokens, step_s, cfg.batch_size, cfg.seq_len) + 4.0


def _scoring_seconds(cfg: QuickstartConfig, splits: dict[str, list[Any]], step_s: float) -> float:
    """What the evaluation and the zero-shot scoring after fine-tuning will cost."""
    _, avg = _task_tokens(splits)
    n_test, n_fit = len(splits["test"]), min(len(splits["train"]), cfg.zeroshot_fit_examples)
    tokens = 0.35 * avg * (2 * n_test + 2 * (n_fit + n_test))
    return budget.seconds_for_tokens(tokens, step_s, cfg.batch_size, cfg.seq_len) + 4.0


def finetune_model(run: _Stages, text: TaskText, pre: Pretrained) -> tuple[Path, str]:
    """Stage 4: fine-tune the pretrained model on the toy task (best dev epoch kept)."""
    from gptcli.tasks import shuffled
    from gptcli.train.finetune import FinetuneConfig, finetune

    cfg = run.cfg
    fc = FinetuneConfig(
        task=shuffled.NAME,
        init=str(pre.checkpoint),
        out=str(run.out / "finetune"),
        data_dir=str(text.task_dir),
        lr=cfg.finetune_lr,
        batch_size=cfg.finetune_batch_size,
        epochs=cfg.finetune_epochs,
        warmup=0.05,
        seed=cfg.seed,
        n_ctx=cfg.model.get("n_ctx"),
        device=cfg.device,
        precision=cfg.precision,
        kernels=cfg.kernels,
        overwrite=True,
        max_minutes=_finetune_minutes(run, text),
    )
    ft = finetune(fc, progress=run.progress)
    if ft.stopped_by:  # a signal: fine-tuning checkpointed and stopped, but a quickstart is all or nothing
        raise _stopped("fine-tuning", ft.stopped_by)
    per_epoch = math.ceil(len(text.splits["train"]) / cfg.finetune_batch_size)
    run.numbers["finetune_starved"] = ft.results["steps"] < per_epoch
    if run.numbers["finetune_starved"]:
        run.progress.note(
            f"the budget left fine-tuning {ft.results['steps']} updates, less than one epoch ({per_epoch}): its "
            f"scores mean nothing (give --minutes more)",
            level="warn",
        )
    dev = ft.results["scores"]
    run.paths["finetune"] = str(ft.checkpoint)
    return ft.checkpoint, (
        f"{ft.results['steps']} updates; best dev MCC {dev.get('mcc', float('nan')):.1f}, "
        f"accuracy {dev.get('accuracy', float('nan')):.1f}% (epoch {ft.results['epoch']})"
        + (" (starved by the time budget: these figures mean nothing)" if run.numbers["finetune_starved"] else "")
    )


def _finetune_minutes(run: _Stages, text: TaskText) -> float | None:
    """Fine-tuning's time limit: what is left of the budget less the scoring after it (at least a few seconds);
    none when pretraining had a fixed number of updates (tests, reproducible runs) rather than a share."""
    if run.cfg.pretrain_steps is not None:
        return None
    share = run.deadline.left() - _scoring_seconds(run.cfg, text.splits, run.update_s)
    return max(share, MIN_FINETUNE_SECONDS) / 60.0


def evaluate_model(run: _Stages, text: TaskText, checkpoint: Path) -> tuple[None, str]:
    """Stage 5: the fine-tuned model on the held-out test split, beside always answering the majority class."""
    from gptcli.eval.tasks import evaluate_task
    from gptcli.tasks import shuffled

    cfg = run.cfg
    ev = evaluate_task(
        shuffled.NAME,
        checkpoint,
        "test",
        data_dir=text.task_dir,
        out=run.out / "eval",
        device=cfg.device,
        precision=cfg.precision,
    )
    test_labels = [r.label for r in text.splits["test"]]
    maj_label, maj_acc = _majority(test_labels)
    run.numbers.update(
        finetuned_accuracy=ev["scores"]["accuracy"],
        finetuned_mcc=ev["scores"]["mcc"],
        majority_accuracy=maj_acc,
        majority_label=maj_label,
        test_examples=len(test_labels),
    )
    run.paths["eval"] = str(run.out / "eval")
    return None, (
        f"test accuracy {ev['scores']['accuracy']:.1f}% (majority class {maj_acc:.1f}%), MCC {ev['scores']['mcc']:.1f}"
    )


def zeroshot_models(run: _Stages, text: TaskText, pre: Pretrained) -> tuple[None, str]:
    """Stage 6: the paper's zero-shot CoLA heuristic on the test split, before and after pretraining."""
    from gptcli.checkpoint import load_checkpoint
    from gptcli.eval.zeroshot import cola as zeroshot_cola
    from gptcli.eval.zeroshot import write_results
    from gptcli.tasks import shuffled

    train_ex = shuffled.SHUFFLED.read("train", text.task_dir)[: run.cfg.zeroshot_fit_examples]
    test_ex = shuffled.SHUFFLED.read("test", text.task_dir)
    after = apply_kernels(load_checkpoint(pre.checkpoint).model.to(pre.device).eval(), pre.device)
    pre.init_model.eval()
    zs: dict[str, Any] = {}
    for name, model in (("before", pre.init_model), ("after", after)):
        r = zeroshot_cola(
            model,
            pre.tokenizer,
            test_ex,
            train_examples=train_ex,
            batch_size=64,
            precision=pre.precision,
            progress=run.progress,
        )
        r.task, r.split = f"{shuffled.NAME}-{name}-pretraining", "test"
        zs[name] = r
        run.numbers[f"zeroshot_mcc_{name}"] = r.score
        run.numbers[f"zeroshot_accuracy_{name}"] = _accuracy(r.predictions)
    write_results(
        run.out / "zeroshot",
        {r.task: r for r in zs.values()},
        {
            "checkpoint": str(pre.checkpoint),
            "heuristic": "cola (average token log-probability, threshold fitted on the train split)",
        },
    )
    run.paths["zeroshot"] = str(run.out / "zeroshot")
    return None, f"MCC {zs['before'].score:.1f} before pretraining → {zs['after'].score:.1f} after"


def write_summary(run: _Stages) -> QuickstartResult:
    """``summary.json``: the numbers (non-finite ones as null), seconds per stage, paths and the settings."""
    from gptcli.config import to_dict

    run.numbers["seconds_total"] = round(time.perf_counter() - run.t_start, 1)
    summary = {
        "numbers": {k: (_finite(v) if isinstance(v, float) else v) for k, v in run.numbers.items()},
        "seconds": run.seconds,
        "paths": run.paths,
        "config": to_dict(run.cfg),
    }
    write_text_atomic(run.out / "summary.json", json.dumps(summary, indent=2, default=str) + "\n")
    return QuickstartResult(run.out, run.numbers, run.seconds, run.paths)


def _majority(labels: list[int]) -> tuple[int, float]:
    ones = sum(labels)
    label = int(ones * 2 > len(labels))
    return label, 100.0 * max(ones, len(labels) - ones) / max(1, len(labels))


def _accuracy(preds: list[dict[str, Any]]) -> float:
    return 100.0 * sum(int(p["prediction"] == p["label"]) for p in preds) / max(1, len(preds))


def _finite(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and math.isfinite(x) else None


__all__ = [
    "LEARNING_UPDATES",
    "QuickstartConfig",
    "QuickstartResult",
    "STAGES",
    "WHAT_NEXT",
    "hold_out",
    "quickstart",
    "stdlib_documents",
    "summary_rows",
]
