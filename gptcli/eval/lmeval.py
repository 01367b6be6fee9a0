"""EleutherAI's lm-evaluation-harness (lm-eval ≥ 0.4) scoring any gpt1 checkpoint: the ``gpt1`` model.

``import gptcli.eval.lmeval`` registers :class:`GPT1LM` in lm-eval's model registry under ``gpt1``; lm-eval 0.4 has
no plugin discovery (no entry-point group for models), so something must import it first: ``gpt1 lmeval …``
(lm-eval's own command line, this module imported before it parses) or, from Python, this import before
``lm_eval.simple_evaluate(model="gpt1", model_args="checkpoint=RUN", …)``. ``docs/lmeval.md`` has the commands.

Every request goes through gpt1's own machinery (:class:`GPT1LM` says how, request by request), so the numbers are
the ones ``gpt1 zeroshot`` and ``gpt1 eval`` report.

Without lm-eval installed this module still imports (the package's tests read every module); building
:class:`GPT1LM` then says to ``pip install 'gpt1[eval]'``.
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from gptcli.errors import GPT1Error
from gptcli.tokenizers.base import Tokenizer

try:  # the optional extra: gpt1[eval]
    import lm_eval.models  # noqa: F401  (registers lm-eval's own models first; registering ours alone would hide them)
    from lm_eval.api.model import LM as _LMBase
    from lm_eval.api.registry import register_model as _register_model
except ImportError:  # pragma: no cover - exercised only without the extra
    _LMBase = object  # type: ignore[assignment,misc]
    _register_model = None

MODEL_NAME = "gpt1"
"""The name ``lm_eval --model`` knows this model by."""
INSTALL_HINT = "lm-eval is not installed (pip install 'gpt1[eval]')"


@dataclass
class HarnessModelConfig:
    """The ``--model_args`` of ``lm_eval --model gpt1`` (``checkpoint=RUN,device=cuda,precision=fp32,…``)."""

    checkpoint: str = ""
    """Checkpoint directory, or a run directory (its newest checkpoint), Transformer or LSTM, any tokenizer; or a
    Hugging Face Hub id of an openai-gpt model (``openai-gpt``: OpenAI's released GPT-1), converted once, as
    ``gpt1 zeroshot`` does."""
    device: str = "auto"
    """``auto`` (CUDA when available), ``cpu``, ``cuda``, ``cuda:1``… (lm-eval's ``--device`` fills it when given)."""
    precision: str = "auto"
    """``auto`` (bf16 autocast on CUDA and on CPUs with native bf16, else fp32), ``fp32``, ``bf16`` or ``fp16``:
    what ``gpt1 zeroshot --precision`` takes. Pass ``fp32`` to reproduce fp32 numbers to 1e-4."""
    batch_size: int = 32
    """Rows per forward pass. lm-eval's ``--batch_size`` fills it when not given here (its command line's own default
    is 1: pass ``--batch_size 32``); ``auto`` means this default."""
    max_gen_toks: int = 256
    """Tokens ``generate_until`` produces at most when a task does not say (its ``max_gen_toks``)."""
    verify: bool = True
    """Check the checkpoint's files against their checksums before loading it."""

    @classmethod
    def of(cls, kwargs: dict[str, Any]) -> HarnessModelConfig:
        """From lm-eval's parsed ``model_args`` plus its ``batch_size``/``device``; unknown names are an error."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(kwargs) - known - {"max_batch_size"})
        if unknown:
            raise GPT1Error(
                f"--model_args {', '.join(unknown)}: unknown for --model {MODEL_NAME} "
                f"(known: {', '.join(sorted(known))})"
            )
        cfg = cls(**{k: v for k, v in kwargs.items() if k in known and v is not None})
        cfg.checkpoint = str(cfg.checkpoint)
        if isinstance(cfg.batch_size, str):  # lm-eval passes the CLI's text: "8", "auto", "auto:4"
            cfg.batch_size = int(cfg.batch_size) if cfg.batch_size.isdigit() else cls.batch_size
        if not cfg.checkpoint:
            raise GPT1Error(
                f"--model_args checkpoint=DIR is required for --model {MODEL_NAME} (a checkpoint or run directory)"
            )
        if int(cfg.batch_size) < 1 or int(cfg.max_gen_toks) < 1:  # checked before anything is loaded
            raise GPT1Error("batch_size and max_gen_toks must be at least 1")
        return cfg


def _present(device: str) -> bool:
    """Whether ``device`` (lm-eval's ``--device``) exists here: any non-CUDA name is passed on (and checked where
    it is used); ``cuda``/``cuda:N`` only with that GPU."""
    import torch

    if not device.startswith("cuda"):
        return True
    index = device.partition(":")[2]
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return count > (int(index) if index.isdigit() else 0)


class GPT1LM(_LMBase):  # type: ignore[misc,valid-type]
    """A gpt1 checkpoint as an lm-eval ``LM``; what each request type computes:

    - **Tokenization** is the checkpoint's tokenizer, ``encode_batch`` exactly as ``gpt1 zeroshot`` calls it (ftfy, the
      released standardisation, spaCy words, lowercasing unless cased, BPE). Context and continuation are encoded
      separately and their ids concatenated (:mod:`gptcli.eval.scoring`'s rule), so the word boundary between them never
      moves; the leading space lm-eval puts on a continuation is dropped by the pipeline as any space is.
    - **loglikelihood** is :func:`gptcli.eval.scoring.score` (length-sorted batches, shared-context passes, KV cache for
      long shared contexts, left truncation of the context). GPT-1 has no end-of-text token: with an empty context the
      first continuation token is not scored (nothing predicts it). ``is_greedy`` is the argmax over the whole output
      layer.
    - **loglikelihood_rolling** cuts a document's ids into the windows ``gpt1 eval`` uses
      (:func:`gptcli.eval.perplexity.eval_windows`): ``n_ctx + 1`` tokens on a stride of ``n_ctx`` (512 for GPT-1), the
      tail covered by one window aligned to the document's end whose already-scored targets are skipped. The windows
      share no context (at most a first token), so each is a row of its own, batched within the token budget. Nothing
      conditions the first window — there is no end-of-text token to prefix — so the document's first token is not
      scored, exactly as ``gpt1 eval`` does not score the first token of a shard. lm-eval's word/byte perplexities still
      divide by the whole document's words/bytes.
    - **generate_until** is greedy :func:`gptcli.model.generate.iter_generate` (KV cache, never a special-token id),
      one prompt at a time, longest first, stopped at ``max_gen_toks``, a full context, or the first stop string.
      Generated text is in the pipeline's form (lowercase for an uncased tokenizer, words separated by spaces), so each
      stop string is matched in that form too (``decode(encode(stop))``); a stop made of whitespace with a newline
      matches the newline token (the pipeline turns any run of line breaks into one). GPT-1 has no end-of-text token:
      without stop strings generation runs to ``max_gen_toks``.
    """

    def __init__(self, **kwargs: Any) -> None:
        if _register_model is None:
            raise GPT1Error(INSTALL_HINT)
        super().__init__()
        from gptcli.eval.zeroshot import open_model
        from gptcli.interop.hub import resolve_checkpoint
        from gptcli.system.runtime import resolve_device

        self.config = HarnessModelConfig.of(kwargs)
        path, _ = resolve_checkpoint(self.config.checkpoint)  # a Hub id (openai-gpt) is converted once, cached
        self.model, self.tokenizer, self.checkpoint = open_model(path, self.config.device, self.config.verify)
        self._device = resolve_device(self.config.device)
        self._encoded: dict[str, list[int]] = {}

    # -- lm-eval's interface ----------------------------------------------------------------------------------
    @classmethod
    def create_from_arg_obj(cls, arg_dict: dict[str, Any], additional_config: dict[str, Any] | None = None):
        """``--model_args`` over lm-eval's own ``--batch_size``/``--device`` (a setting in both is taken from
        ``--model_args``; lm-eval's ``None`` means unset)."""
        extra = {k: v for k, v in (additional_config or {}).items() if v is not None}
        if "device" not in arg_dict and not _present(str(extra.get("device", ""))):
            # lm-eval passes its --device whether given or not (default "cuda:0"): on a machine without that GPU
            # take the best device there is, as lm-eval's own `hf` model does (a device in --model_args is strict).
            extra.pop("device", None)
        return cls(**{**extra, **arg_dict})

    @classmethod
    def create_from_arg_string(cls, arg_string: str, additional_config: dict[str, Any] | None = None):
        from lm_eval.utils import simple_parse_args_string

        return cls.create_from_arg_obj(simple_parse_args_string(arg_string), additional_config)

    @property
    def tokenizer_name(self) -> str:
        return f"gpt1-{self.tokenizer.kind}"

    def loglikelihood(self, requests: Sequence[Any], disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        pairs = [tuple(r.args[:2]) for r in requests]
        self._encode_all(t for pair in pairs for t in pair)
        from gptcli.eval.scoring import Request

        scores = self._score([Request.of(self._encoded[c], self._encoded[k]) for c, k in pairs])
        out = [(s.logprob, bool(s.greedy)) for s in scores]
        for pair, res in zip(pairs, out):
            self.cache_hook.add_partial("loglikelihood", pair, res)
        return out

    def loglikelihood_rolling(self, requests: Sequence[Any], disable_tqdm: bool = False) -> list[float]:
        texts = [r.args[0] for r in requests]
        self._encode_all(texts)
        requests_of_doc = [rolling_requests(self._encoded[t], self.model.config.n_ctx) for t in texts]
        scores = self._score([q for qs in requests_of_doc for q in qs], shared=False)
        out, k = [], 0
        for qs in requests_of_doc:
            out.append(float(sum(s.logprob for s in scores[k : k + len(qs)])))
            k += len(qs)
        for text, res in zip(texts, out):
            self.cache_hook.add_partial("loglikelihood_rolling", (text,), res)
        return out

    def generate_until(self, requests: Sequence[Any], disable_tqdm: bool = False) -> list[str]:
        items = [(r.args[0], dict(r.args[1]) if len(r.args) > 1 and r.args[1] else {}) for r in requests]
        self._encode_all(c for c, _ in items)
        order = sorted(range(len(items)), key=lambda i: -len(self._encoded[items[i][0]]))  # longest first
        out: list[str] = [""] * len(items)
        for i in order:
            context, kw = items[i]
            out[i] = self._generate(self._encoded[context], kw)
            self.cache_hook.add_partial("generate_until", (context, kw), out[i])
        return out

    # -- gpt1's machinery -------------------------------------------------------------------------------------
    def _encode_all(self, texts: Iterable[str]) -> None:
        """Encode every text not seen yet, in one ``encode_batch`` call (as ``gpt1 zeroshot`` does)."""
        new = list(dict.fromkeys(t for t in texts if t not in self._encoded))
        for t, ids in zip(new, self.tokenizer.encode_batch(new) if new else []):
            self._encoded[t] = list(ids)

    def _score(self, requests: list, shared: bool = True) -> list:
        """:func:`gptcli.eval.scoring.score` of ``requests``. ``shared=False`` when they share no context, only
        perhaps its first token (rolling windows): then none is run once for many, every row on its own."""
        from gptcli.eval.scoring import score

        return score(
            self.model,
            requests,
            batch_size=int(self.config.batch_size),
            precision=self.config.precision,  # type: ignore[arg-type]
            cache_min_context=None if shared else self.model.config.n_ctx + 2,
        )

    def _generate(self, prompt: list[int], kw: dict[str, Any]) -> str:
        from gptcli.model.generate import SamplingConfig, iter_generate

        n_ctx = self.model.config.n_ctx
        max_new = int(kw.get("max_gen_toks", self.config.max_gen_toks))
        prompt = prompt[-max(1, n_ctx - max_new) :] if prompt else []
        if not prompt:
            raise GPT1Error(
                "generate_until: the context is empty after cleaning; GPT-1 has no start-of-text token to generate from"
            )
        stops = stop_forms(self.tokenizer, kw.get("until"))
        sampling = SamplingConfig(max_new_tokens=max_new, greedy=True)
        generated: list[int] = []
        text = ""
        for token in iter_generate(self.model, prompt, sampling, vocab_limit=self.tokenizer.vocab_size):
            generated.append(token)
            text = self.tokenizer.decode(generated)
            cut = first_stop(text, stops)
            if cut is not None:
                return text[:cut]
        return text


def rolling_requests(ids: Sequence[int], n_ctx: int) -> list:
    """A document's ids as scoring requests, one per window of :func:`gptcli.eval.perplexity.eval_windows` (the
    windows ``gpt1 eval`` scores): context = the window's first token and its already-scored targets, continuation =
    the targets still to score. Every token but the first is scored exactly once."""
    import numpy as np

    from gptcli.eval.perplexity import eval_windows
    from gptcli.eval.scoring import Request

    out = []
    for window, skip in eval_windows([np.asarray(ids, dtype=np.int64)], n_ctx):
        w = window.tolist()
        out.append(Request.of(w[: skip + 1], w[skip + 1 :]))
    return out


def stop_forms(tokenizer: Tokenizer, until: str | Sequence[str] | None) -> list[str]:
    """Stop strings in the form generated text takes (``decode(encode(stop))``); whitespace with a line break is the
    newline the pipeline keeps; a stop that cleans away to nothing else is dropped (it could never be matched)."""
    if until is None:
        return []
    out = []
    for stop in [until] if isinstance(until, str) else list(until):
        if not stop.strip():
            if "\n" in stop:
                out.append("\n")
            continue
        form = tokenizer.decode(tokenizer.encode(stop)).strip(" ")
        if form:
            out.append(form)
    return list(dict.fromkeys(out))


def first_stop(text: str, stops: Sequence[str]) -> int | None:
    """Where the earliest stop string starts in ``text`` (None when none occurs)."""
    hits = [i for i in (text.find(s) for s in stops) if i >= 0]
    return min(hits) if hits else None


if _register_model is not None:
    _register_model(MODEL_NAME)(GPT1LM)


def run_cli(argv: Sequence[str], local_tasks: str | Path | None = None) -> None:
    """lm-eval's own command line (``lm_eval …`` / ``lm-eval run …``) with the ``gpt1`` model registered: what
    ``gpt1 lmeval`` runs. ``argv`` are lm-eval's arguments, unchanged. With ``local_tasks`` (a data root such as
    ``../shared/data``) the local task configs of :mod:`gptcli.eval.lmeval_tasks` are written to a temporary folder
    for this run and added to ``--include_path``."""
    if _register_model is None:
        raise GPT1Error(INSTALL_HINT)
    from lm_eval.__main__ import cli_evaluate

    args = list(argv)
    with tempfile.TemporaryDirectory(prefix="gpt1-lmeval-tasks-") as tmp:
        if local_tasks is not None:
            from gptcli.eval.lmeval_tasks import write_local_tasks

            write_local_tasks(local_tasks, tmp)
            args = _with_include_path(args, tmp)
        saved = sys.argv
        sys.argv = ["lm-eval", *args]
        try:
            cli_evaluate()
        finally:
            sys.argv = saved


def _with_include_path(args: list[str], path: str) -> list[str]:
    """``args`` with ``--include_path path``; lm-eval takes one folder, so a second one is refused."""
    if any(a == "--include_path" or a.startswith("--include_path=") for a in args):
        raise GPT1Error(
            "--local-tasks writes its own --include_path folder; give one of them (or write the local "
            "tasks into your folder with gptcli.eval.lmeval_tasks.write_local_tasks)"
        )
    return args + ["--include_path", path]
