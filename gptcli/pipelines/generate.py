"""``gpt1 generate`` as a library call: a checkpoint continues a text prompt, streamed as text.

:func:`start_generation` loads the checkpoint and turns the prompt into ids (cleaned and tokenized like training
text, trimmed to fit the context); :meth:`Generation.stream` then yields the continuation as pieces of text as
each token is chosen (:func:`gptcli.model.generate.iter_generate`, KV-cached), and :meth:`Generation.sample_texts`
returns ``samples`` continuations decoded together as one batch. Both compute in the config's ``kernels`` mode,
set around each step of the model and given back between them, so the caller's code between the pieces runs in
the process's own mode. The caller decides where the text goes::

    gen = start_generation(GenerateConfig(checkpoint=Path("run"), prompt="The ship", max_new_tokens=20))
    print(gen.prompt_text + "".join(gen.stream()))

    gen = start_generation(GenerateConfig(checkpoint=Path("run"), prompt="The ship", samples=4, seed=1))
    for text in gen.sample_texts():
        print(gen.prompt_text + text)
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from gptcli.errors import GPT1Error
from gptcli.model.generate import GenerateConfig, iter_generate, iter_generate_batch
from gptcli.model.kernels import apply as apply_kernels
from gptcli.model.kernels import check_mode, use_kernels
from gptcli.progress import SILENT, Progress, staged

PASS_BYTES = 2 << 30
"""What one batch of samples may hold on a CPU (their caches and per-step logits); on a GPU, half its free memory.
More samples are drawn in several passes: --samples 1024 of the paper's model would otherwise need tens of GB at
once."""


def sample_bytes(n_layer: int, width: int, vocab: int, length: int) -> int:
    """About what one sample holds while it is decoded: its keys and values for ``length`` positions in every layer
    (fp32) and a few vocabulary-wide rows of logits per step (the logits, their float copy, the top-k masks)."""
    return 4 * (2 * n_layer * length * width + 6 * vocab)


def samples_per_pass(per_sample: int, device: Any) -> int:
    """How many samples one batch may hold (see :data:`PASS_BYTES`), at least one."""
    import torch

    budget = PASS_BYTES
    if getattr(device, "type", str(device)) == "cuda":
        budget = torch.cuda.mem_get_info(device)[0] // 2
    return max(1, budget // max(1, per_sample))


def pass_seed(seed: int | None, index: int) -> int | None:
    """The seed of a batch after the first (the first keeps ``seed``, so a count that fits one batch draws what it
    always drew); another seed for each, or the passes would repeat each other."""
    return None if seed is None or index == 0 else (seed * 1_000_003 + index) % 2**32


@dataclass
class Generation:
    """A prompt ready to be continued, and (after :meth:`stream`) what was generated."""

    config: GenerateConfig
    model: Any
    tokenizer: Any
    device: Any
    ids: list[int]
    """The prompt's ids as the model sees them (the last ``n_ctx - 1`` if it was longer)."""
    generated: list[int] = field(default_factory=list)
    """The new ids, after :meth:`stream`."""
    rows: list[list[int]] = field(default_factory=list)
    """The new ids of every sample, after :meth:`sample_texts`."""
    batches: int = 1
    """How many batches :meth:`sample_texts` drew the samples in (more than one when one would not fit in memory)."""
    seconds: float = 0.0
    """Wall-clock seconds :meth:`stream` (decoding and the caller's handling of each piece included) or
    :meth:`sample_texts` took."""

    @property
    def prompt_text(self) -> str:
        """The prompt as the model sees it: cleaned, lowercased, trimmed."""
        return self.tokenizer.decode(self.ids)

    def stream(self) -> Iterator[str]:
        """The continuation, one new piece of text per generated token.

        The whole sequence is decoded each time and the new suffix yielded, which keeps spacing right for any
        tokenizer (a BPE token's leading space depends on its neighbours)."""
        shown = len(self.prompt_text)
        t0 = time.perf_counter()
        tokens = iter_generate(self.model, self.ids, self.config, vocab_limit=self.tokenizer.vocab_size)
        try:
            while True:
                with use_kernels(self.config.kernels):  # this step's model computes in the config's mode ...
                    token = next(tokens, None)
                if token is None:  # ... and the caller's code between the pieces runs in its own
                    break
                self.generated.append(token)
                text = self.tokenizer.decode(self.ids + self.generated)
                yield text[shown:]
                shown = len(text)
        except ValueError as e:
            raise GPT1Error(str(e)) from None
        finally:
            self.seconds = time.perf_counter() - t0

    def sample_texts(self, progress: Progress | None = None) -> list[str]:
        """``config.samples`` continuations decoded together as one batch — or, when they would not fit in memory
        (:func:`samples_per_pass`), in several, said as a note — each as the text it adds after the prompt
        (:func:`gptcli.model.generate.iter_generate_batch`); ``progress`` sees one step per token position and
        batch."""
        cfg, report, c = self.config, progress or SILENT, self.model.config
        steps = min(cfg.max_new_tokens, c.n_ctx - len(self.ids))
        width = getattr(c, "n_embd", 0) + getattr(c, "n_hidden", 0)
        per_sample = sample_bytes(c.n_layer, width, c.vocab_size, len(self.ids) + steps)
        per_pass = min(cfg.samples, samples_per_pass(per_sample, self.device))
        passes = self.batches = -(-cfg.samples // per_pass)
        if passes > 1:
            report.note(
                f"{cfg.samples} samples would hold about {per_sample * cfg.samples / 1e9:.1f} GB at once: sampling "
                f"them {per_pass} at a time ({passes} batches)"
            )
        self.rows = [[] for _ in range(cfg.samples)]
        t0 = time.perf_counter()
        try:
            with use_kernels(cfg.kernels), staged(report, f"sampling {cfg.samples} continuations", steps * passes):
                for i, start in enumerate(range(0, cfg.samples, per_pass)):
                    rows = self.rows[start : start + per_pass]
                    batch_cfg = dataclasses.replace(cfg, seed=pass_seed(cfg.seed, i)) if i else cfg
                    for step in iter_generate_batch(
                        self.model, self.ids, batch_cfg, samples=len(rows), vocab_limit=self.tokenizer.vocab_size
                    ):
                        for row, token in zip(rows, step):
                            row.append(token)
                        report.advance(1)
        except ValueError as e:
            raise GPT1Error(str(e)) from None
        finally:
            self.seconds = time.perf_counter() - t0
        shown = len(self.prompt_text)
        return [self.tokenizer.decode(self.ids + row)[shown:] for row in self.rows]


def start_generation(cfg: GenerateConfig, progress: Progress | None = None) -> Generation:
    """Check the settings, load the checkpoint on its device and encode the prompt. A prompt longer than the
    context keeps its last ``n_ctx - 1`` tokens (one position is left to generate into) and says so as a warning
    note."""
    from gptcli.checkpoint import load_checkpoint
    from gptcli.config import check_settings
    from gptcli.system.runtime import resolve_device

    report = progress or SILENT
    check_settings(cfg)  # one rule per number (gptcli.config.RULES): --samples 100000 is refused before any work
    if cfg.checkpoint is None:
        raise GPT1Error("--checkpoint is required (a checkpoint or run directory)")
    if cfg.prompt is None:
        raise GPT1Error("--prompt is required (the text to continue)")
    try:
        cfg.validate()
    except ValueError as e:
        raise GPT1Error(str(e)) from None
    check_mode(cfg.kernels)  # applied where the model computes: each step of stream() and sample_texts()
    device = resolve_device(cfg.device)
    ckpt = load_checkpoint(cfg.checkpoint, map_location=device, verify=cfg.verify)
    with use_kernels(cfg.kernels):  # the kernels applied to the model where the config's mode runs them
        apply_kernels(ckpt.model, device)
    tok = ckpt.tokenizer
    if tok is None:
        raise GPT1Error(f"{ckpt.path}: the checkpoint has no tokenizer/ directory; cannot turn the prompt into ids")
    ids = tok.encode(cfg.prompt)
    if not ids:
        raise GPT1Error("the prompt is empty after cleaning; GPT-1 needs at least one token to continue")
    n_ctx = ckpt.config.n_ctx
    if len(ids) >= n_ctx:
        report.note(
            f"prompt has {len(ids)} tokens; keeping the last {n_ctx - 1} of the {n_ctx}-token context", level="warn"
        )
        ids = ids[-(n_ctx - 1) :]
    return Generation(cfg, ckpt.model, tok, device, ids)


__all__ = ["Generation", "start_generation"]
