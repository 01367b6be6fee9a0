"""Checks through the ``gpt1`` commands on real text: the corpus, ``--gpus 1`` against an in-process step,
checkpoint and resume, out-of-memory handling, and pretrain → finetune → eval → zeroshot.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .context import Ctx, Failed, Skipped, finite
from .models import rel
from .registry import check


def corpus_paths(ctx: Ctx) -> tuple[Path, Path]:
    """The prepared corpus and the CoLA-format task folder written by the ``corpus`` check (Skipped without)."""
    corpus, task = ctx.work / "corpus", ctx.work / "task"
    if not (corpus / "manifest.json").is_file() or not (task / "train.tsv").is_file():
        raise Skipped("needs the corpus check's real-text corpus, which did not finish")
    return corpus, task


@check("corpus", 240, "real text: stdlib docstrings → `gpt1 prepare` corpus + a CoLA-format task (as quickstart)")
def check_corpus(ctx: Ctx) -> str:
    # The quickstart's offline text: this Python's standard-library docstrings, nothing downloaded. Held-out
    # modules' prose sentences, as written and word-shuffled, are a CoLA-format task (`--task cola`).
    import sysconfig

    from gptcli.pipelines.quickstart import QuickstartConfig, hold_out, stdlib_documents, task_splits
    from gptcli.tasks import shuffled

    root = Path(sysconfig.get_paths()["stdlib"])
    if ctx.sizes.text_root and (root / ctx.sizes.text_root).is_dir():
        root = root / ctx.sizes.text_root
    docs = stdlib_documents(root, max_modules=ctx.sizes.modules)
    train_docs, held_docs = hold_out(docs, 0.3, seed=0)
    text = ctx.work / "text.jsonl"
    with open(text, "w", encoding="utf-8") as f:
        for module, body in train_docs:
            f.write(json.dumps({"module": module, "text": body}) + "\n")
    _, splits = task_splits(train_docs, held_docs, QuickstartConfig())
    shuffled.write_task_files(splits, ctx.work / "task")
    ctx.record(
        text=f"standard library: {root.name}",
        modules=len(docs),
        characters=sum(len(t) for _, t in train_docs),
        task_examples={k: len(v) for k, v in splits.items()},
    )
    ctx.cli(
        "prepare",
        str(text),
        "--out",
        str(ctx.work / "corpus"),
        "--vocab-size",
        str(ctx.sizes.corpus_vocab),
        "--val-fraction",
        "0.05",
        "--workers",
        "1" if ctx.dry else "0",
        timeout=220,
    )
    from gptcli.data.shards import open_corpus

    manifest = json.loads((ctx.work / "corpus" / "manifest.json").read_text(encoding="utf-8"))
    tokens = {k: v.get("tokens") for k, v in manifest.get("splits", {}).items()}
    vocab = open_corpus(ctx.work / "corpus").tokenizer.vocab_size
    ctx.record(tokens=tokens, vocab_size=vocab)
    return f"{len(train_docs)} modules → {tokens.get('train'):,} training tokens, vocabulary {vocab}"


def pretrain_args(ctx: Ctx, corpus: Path, out: Path, steps: int, *extra: str) -> list[str]:
    s = ctx.sizes
    return [
        "pretrain",
        "--data",
        str(corpus),
        "--out",
        str(out),
        "--preset",
        s.pt_preset,
        "--seq-len",
        str(s.pt_seq),
        "--batch-size",
        str(s.pt_batch),
        "--max-steps",
        str(steps),
        "--log-every",
        "1",
        "--eval-every",
        "0",
        "--eval-batches",
        "1",
        "--save-every",
        "0",
        "--keep-last",
        "2",
        "--no-verify",
        "--quiet",
        "--device",
        "cuda" if ctx.cuda else "cpu",
        *extra,
    ]


def train_records(run: Path) -> dict[int, dict[str, Any]]:
    lines = (run / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    recs = [json.loads(x) for x in lines if x.strip()]
    return {r["step"]: r for r in recs if r.get("kind") == "train"}


@check(
    "launched_vs_inprocess",
    180,
    "`gpt1 pretrain --gpus 1` (launcher, NCCL, DDP) against an in-process "
    "Trainer step on real text: losses and gradient norms",
)
def check_launched(ctx: Ctx) -> str:
    corpus, _ = corpus_paths(ctx)
    steps = 3
    launch = ["--gpus", "1"] if ctx.cuda else ["--procs", "1"]
    # fp32 (TF32 matmuls on the GPU) and no dropout: both sides then compute the same function.
    run = ctx.work / "launched"
    ctx.cli(
        *pretrain_args(
            ctx, corpus, run, steps, "--precision", "fp32", "--dropout", "0", "--warmup-steps", "2", *launch
        ),
        timeout=170,
    )
    launched = train_records(run)
    mine = inprocess_updates(ctx, corpus, steps)
    rows = [
        {
            "step": s,
            "loss": launched[s]["loss"],
            "loss_inprocess": mine[s - 1][0],
            "grad_norm": launched[s]["grad_norm"],
            "grad_norm_inprocess": mine[s - 1][1],
        }
        for s in range(1, steps + 1)
    ]
    worst_loss = max(rel(r["loss"], r["loss_inprocess"]) for r in rows)
    worst_norm = max(rel(r["grad_norm"], r["grad_norm_inprocess"]) for r in rows)
    tol = {"loss": 1e-4, "grad_norm": 1e-3}
    ctx.record(
        path=" ".join(launch), updates=rows, max_rel_loss=worst_loss, max_rel_grad_norm=worst_norm, tolerance=tol
    )
    if worst_loss > tol["loss"] or worst_norm > tol["grad_norm"]:
        raise Failed(f"launched and in-process updates differ: loss {worst_loss:.2e}, grad norm {worst_norm:.2e}")
    return f"{' '.join(launch)} vs in-process, {steps} updates: loss {worst_loss:.1e}, grad norm {worst_norm:.1e}"


def inprocess_updates(ctx: Ctx, corpus: Path, steps: int) -> list[tuple[float, float]]:
    """(loss, grad norm) of the first updates as pretrain() computes them, assembled from the library's parts."""
    import torch

    from gptcli.data.shards import open_corpus
    from gptcli.data.windows import WindowSampler
    from gptcli.model.build import build_model
    from gptcli.system.runtime import configure_backends
    from gptcli.train.optim import lr_at, make_optimizer
    from gptcli.train.pretrain import PretrainConfig, build_model_config, lm_loss, plan_steps
    from gptcli.train.trainer import Trainer, split_micro_batches

    s = ctx.sizes
    cfg = PretrainConfig(
        data=corpus,
        preset=s.pt_preset,
        seq_len=s.pt_seq,
        batch_size=s.pt_batch,
        max_steps=steps,
        warmup_steps=2,
        precision="fp32",
        model={"embd_pdrop": 0.0, "attn_pdrop": 0.0, "resid_pdrop": 0.0},
    )
    configure_backends(ctx.device)
    data = open_corpus(corpus)
    mcfg = build_model_config(cfg, data.tokenizer.vocab_size)
    sampler = WindowSampler(data.arrays("train"), cfg.seq_len, cfg.batch_size, cfg.seed)
    total = plan_steps(cfg, sampler.steps_per_epoch)
    torch.manual_seed(cfg.seed)
    model = build_model(mcfg).to(ctx.device)
    opt = make_optimizer(model, cfg.lr, cfg.weight_decay, (cfg.beta1, cfg.beta2), cfg.eps, cfg.decay)
    tr = Trainer(
        model,
        opt,
        lm_loss,
        lambda i: lr_at(i, total, cfg.lr, cfg.warmup_steps, cfg.schedule),
        device=ctx.device,
        precision="fp32",
        grad_clip=cfg.grad_clip,
    )
    out = []
    for i in range(steps):
        res = tr.step(i, split_micro_batches(sampler.next_batch().to(ctx.device), cfg.batch_size))
        out.append((float(res.loss), float(res.grad_norm)))
    return out


@check(
    "resume",
    240,
    "checkpoint → resume: next losses equal to an uninterrupted run; CUDA RNG state restored; "
    "the fused optimizer's step tensor on the parameters' device",
)
def check_resume(ctx: Ctx) -> str:
    corpus, _ = corpus_paths(ctx)
    total, stop = 6, 3
    # Dropout on (the CUDA RNG must be restored for the masks to repeat); a constant schedule after warm-up, so that
    # a run of 3 updates and one of 6 share their first learning rates.
    common = (
        "--precision",
        "fp32",
        "--schedule",
        "constant",
        "--warmup-steps",
        "2",
        "--n-layer",
        str(ctx.sizes.resume_layers),
    )
    whole, parts = ctx.work / "resume-whole", ctx.work / "resume-parts"
    ctx.cli(*pretrain_args(ctx, corpus, whole, total, *common), timeout=120)
    ctx.cli(*pretrain_args(ctx, corpus, parts, stop, *common), timeout=120)
    ctx.cli(*pretrain_args(ctx, corpus, parts, total, *common, "--resume"), timeout=120)
    a, b = train_records(whole), train_records(parts)
    rows = [{"step": s, "uninterrupted": a[s]["loss"], "resumed": b[s]["loss"]} for s in range(1, total + 1)]
    noise = max(rel(b[s]["loss"], a[s]["loss"]) for s in range(1, stop + 1))  # the same updates, run twice
    after = max(rel(b[s]["loss"], a[s]["loss"]) for s in range(stop + 1, total + 1))
    ctx.record(
        n_layer=ctx.sizes.resume_layers,
        losses=rows,
        rel_diff_before_stop=noise,
        rel_diff_after_resume=after,
        tolerance=1e-4,
    )
    state = restored_state(ctx, parts / "checkpoints" / f"step-{stop:07d}")
    ctx.record(**state)
    if after > 1e-4:
        raise Failed(f"resumed losses differ from the uninterrupted run by {after:.2e} (before the stop: {noise:.2e})")
    ctx.need_cuda("CUDA RNG state and the fused step tensor's device only exist on CUDA; CPU losses matched")
    if not state["cuda_rng_saved"] or not state["cuda_rng_restored"]:
        raise Failed("the checkpoint's CUDA RNG state was not saved or not restored")
    if state["step_tensor_devices"] != [state["param_device"]]:
        raise Failed(f"restored step tensors on {state['step_tensor_devices']}, params on {state['param_device']}")
    return (
        f"after resume: {after:.1e} (run-to-run before the stop {noise:.1e}); CUDA RNG restored; step on "
        f"{state['param_device']}"
    )


@check(
    "out_of_memory",
    180,
    "a run whose update does not fit (the GPU capped at 1 GiB more than in use): one "
    "OutOfMemory naming "
    "--micro-batch-size, and its advice followed until the run fits and finishes; the memory given back after",
)
def check_out_of_memory(ctx: Ctx) -> str:
    """PyTorch's "CUDA out of memory" inside a real update, turned into gpt1's one line (gptcli/train/run/memory.py)
    with the GPU's figures, and the advice it gives followed until the run fits. The GPU is capped for this process
    (``torch.cuda.set_per_process_memory_fraction``) so that a small run stands for a paper-sized one; the dry run,
    with no memory to cap, refuses micro-batches over 2 sequences in the trainer instead."""
    import gc

    import torch

    from gptcli.train.pretrain import PretrainConfig, pretrain
    from gptcli.train.run.memory import OutOfMemory

    corpus, _ = corpus_paths(ctx)
    s = ctx.sizes
    # The resume check's depth: the finishing run writes a checkpoint, which at 12 blocks takes seconds to hash.
    cfg = PretrainConfig(
        data=corpus,
        out=ctx.work / "oom",
        preset=s.pt_preset,
        model={"n_layer": s.resume_layers},
        seq_len=s.pt_seq,
        batch_size=64,
        max_steps=2,
        warmup_steps=1,
        eval_every=0,
        eval_batches=1,
        save_every=0,
        log_every=1,
        verify_data=False,
        device="cuda" if ctx.cuda else "cpu",
        precision=ctx.precision,
    )
    attempts: list[dict[str, Any]] = []
    with _memory_cap(ctx, gib=1.0):
        micro = None
        for _ in range(8):
            message = _oom_message(
                functools.partial(pretrain, dataclasses.replace(cfg, micro_batch_size=micro)), OutOfMemory
            )
            gc.collect()  # the failed update's tensors, held in reference cycles of its frames, before the next try
            if ctx.cuda:
                torch.cuda.empty_cache()
            attempts.append({"micro_batch_size": micro or cfg.batch_size, "error": message})
            ctx.record(attempts=attempts)
            if message is None:
                break
            advice = re.search(r"pass --micro-batch-size (\d+):", message)
            if advice is None:
                raise Failed(f"the error names no --micro-batch-size: {message}")
            micro = int(advice[1])
    if ctx.cuda:
        ctx.record(allocated_after_gib=round(torch.cuda.memory_allocated() / 2**30, 2))
    first = attempts[0]["error"] or ""
    shape = r"^(cuda:\d|cpu) ran out of memory in update 1 of 2(; [\d.]+ of [\d.]+ GiB in use)? \(pass --micro-batch"
    if not re.match(shape, first):
        raise Failed(f"the first run's error is not the one line expected: {first!r}")
    if attempts[-1]["error"] is not None:
        raise Failed(f"still out of memory after {len(attempts)} runs following the advice")
    sizes = " → ".join(str(a["micro_batch_size"]) for a in attempts)
    ctx.need_cuda("the dry run's trainer refused the large micro-batches itself; the advice was followed")
    if "GiB in use" not in first:
        raise Failed(f"the CUDA error does not say how much memory was in use: {first!r}")
    return f"micro-batches {sizes}: fitted and finished; first error: {first[:160]}"


@contextlib.contextmanager
def _memory_cap(ctx: Ctx, gib: float):
    """This process's GPU allocations capped at ``gib`` more than it holds now (restored after); in the dry run, a
    trainer that raises PyTorch's out-of-memory error for micro-batches over 2 sequences."""
    import torch

    if ctx.cuda:
        total = torch.cuda.get_device_properties(ctx.device).total_memory
        torch.cuda.empty_cache()
        held = torch.cuda.memory_allocated(ctx.device)  # what earlier checks left: the cap comes on top of it
        ctx.record(cap_gib=gib, held_before_gib=round(held / 2**30, 2))
        torch.cuda.set_per_process_memory_fraction(min(1.0, (held + gib * 2**30) / total), ctx.device)
        try:
            yield
        finally:
            torch.cuda.set_per_process_memory_fraction(1.0, ctx.device)
        return
    from gptcli.train.trainer import Trainer

    real = Trainer.step

    def step(self, i, micro_batches):
        if max(len(mb) for mb in micro_batches) > 2:
            raise torch.OutOfMemoryError("CPU stand-in: out of memory (the dry run's cap)")
        return real(self, i, micro_batches)

    Trainer.step = step
    try:
        yield
    finally:
        Trainer.step = real


def _oom_message(run: Callable[[], Any], error: type) -> str | None:
    """``run()``; the message of the ``error`` it raised, else None. Only the text leaves this frame: the exception's
    traceback holds the failed update's tensors, which must be freed before the next attempt."""
    try:
        run()
    except error as e:
        return str(e)
    return None


def restored_state(ctx: Ctx, path: Path) -> dict[str, Any]:
    """Restore a checkpoint's optimizer and RNG state into a fresh model here and look at what came back."""
    import torch

    from gptcli import checkpoint as ckpt
    from gptcli.train.optim import make_optimizer
    from gptcli.train.run.training_state import read_training_state, restore_training_state

    saved = ckpt.load_checkpoint(path, map_location=ctx.device, load_tokenizer=False, verify=False)
    model = saved.model.to(ctx.device)
    opt = make_optimizer(model, 2.5e-4)
    doc, tensors = read_training_state(path, verify=False)
    cuda_saved = "rng.torch_cuda.0" in tensors
    if ctx.cuda:
        torch.cuda.manual_seed_all(12345)  # something else, so that equality below means "restored"
    restore_training_state(doc, tensors, opt)
    restored = bool(ctx.cuda and cuda_saved and torch.equal(torch.cuda.get_rng_state(0), tensors["rng.torch_cuda.0"]))
    steps = sorted({str(s["step"].device) for s in opt.state.values() if "step" in s})
    return {
        "cuda_rng_saved": cuda_saved,
        "cuda_rng_restored": restored,
        "optimizer_fused": opt.defaults.get("fused"),
        "step_tensor_devices": steps,
        "param_device": str(next(model.parameters()).device),
    }


@check(
    "finetune_eval_zeroshot",
    240,
    "`gpt1 pretrain` (tiny) → `finetune --task cola` → `eval` → `zeroshot` on the real-text CoLA-format task",
)
def check_finetune_eval_zeroshot(ctx: Ctx) -> str:
    corpus, task = corpus_paths(ctx)
    device = "cuda" if ctx.cuda else "cpu"
    steps = 4 if ctx.dry else 30
    pre, ft, ev, zs = (ctx.work / f"e2e-{n}" for n in ("pretrain", "finetune", "eval", "zeroshot"))
    seconds: dict[str, float] = {}

    def timed(name: str, *args: str) -> None:
        t0 = time.perf_counter()
        ctx.cli(*args, timeout=200)
        seconds[name] = round(time.perf_counter() - t0, 1)
        ctx.record(seconds=seconds)

    timed(
        "pretrain",
        "pretrain",
        "--data",
        str(corpus),
        "--out",
        str(pre),
        "--preset",
        "tiny",
        "--seq-len",
        "64",
        "--batch-size",
        "8",
        "--max-steps",
        str(steps),
        "--warmup-steps",
        "2",
        "--lr",
        "1e-3",
        "--eval-every",
        "0",
        "--eval-batches",
        "2",
        "--no-verify",
        "--quiet",
        "--device",
        device,
    )
    limit = (
        ["--max-train-examples", "16", "--max-eval-examples", "8"]
        if ctx.dry
        else ["--max-train-examples", "256", "--max-eval-examples", "64"]
    )
    timed(
        "finetune",
        "finetune",
        "--task",
        "cola",
        "--init",
        str(pre),
        "--out",
        str(ft),
        "--data-dir",
        str(task),
        "--epochs",
        "1",
        "--batch-size",
        "8",
        "--lr",
        "5e-4",
        *limit,
        "--device",
        device,
        "--quiet",
    )
    timed(
        "eval",
        "eval",
        "--checkpoint",
        str(ft),
        "--task",
        "cola",
        "--split",
        "dev",
        "--data-dir",
        str(task),
        "--out",
        str(ev),
        "--max-examples",
        "8" if ctx.dry else "64",
        "--device",
        device,
        "--precision",
        "auto",
    )
    timed(
        "zeroshot",
        "zeroshot",
        "--task",
        "cola",
        "--checkpoint",
        str(pre),
        "--data-dir",
        str(task),
        "--split",
        "dev",
        "--limit",
        "8" if ctx.dry else "64",
        "--out",
        str(zs),
        "--device",
        device,
    )
    # eval writes one folder per checkpoint and task under --out (e2e-eval/e2e-finetune/cola-dev/results.json).
    evaluated = sorted(ev.rglob("results.json"))
    scores = {
        "finetune_dev": read_scores(ft / "results.json"),
        "eval_dev": read_scores(evaluated[0]) if evaluated else None,
        "zeroshot_dev": read_scores(zs / "results.json"),
    }
    ctx.record(scores=scores)
    return f"all four commands ran on {device} ({sum(seconds.values()):.0f} s)"


def read_scores(path: Path) -> Any:
    """The numbers of a results.json (whatever its layout), or None when it is missing."""
    if not path.is_file():
        return None
    doc = json.loads(path.read_text(encoding="utf-8"))

    def numbers(x: Any, depth: int = 0) -> Any:
        if isinstance(x, dict) and depth < 4:
            kept = {k: numbers(v, depth + 1) for k, v in x.items() if k not in ("predictions", "config", "history")}
            return {k: v for k, v in kept.items() if v not in (None, {}, [])}
        return finite(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None

    return numbers(doc)
