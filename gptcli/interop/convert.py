"""Weights in and out: Hugging Face ``openai-gpt`` checkpoints and OpenAI's original ``.npy`` release.

- :func:`from_hf` reads a Hugging Face directory → model + tokenizer (Hub ids: :mod:`gptcli.interop.hub`).
- :func:`from_openai` reads the original release (``params_0.npy`` … ``params_9.npy`` + ``params_shapes.json``).
- :func:`to_hf` writes a directory that ``transformers.AutoModelForCausalLM.from_pretrained`` and
  ``AutoTokenizer.from_pretrained`` load (no remote code), whichever tokenizer the checkpoint has.
- :func:`convert_to_checkpoint` saves a converted model as an ordinary gpt1 checkpoint directory.
- :func:`convert` does one whole conversion as a :class:`ConvertConfig` describes it (what ``gpt1 convert`` runs).

Nothing here imports ``transformers``, so converting needs no deep-learning stack beyond torch; pickled PyTorch
files are read with ``weights_only=True`` only, so a checkpoint from elsewhere cannot run code.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import torch

from gptcli.checkpoint import Checkpoint, atomic_directory, load_checkpoint, read_header, save_checkpoint, save_tensors
from gptcli.errors import DataError, GPT1Error
from gptcli.files.locks import output_lock
from gptcli.files.outputs import check_output, mark
from gptcli.interop.hf import config_from_hf, read_hf_config, state_dict_from_hf, state_dict_to_hf, write_hf_config
from gptcli.model.gpt import GPT, ModelConfig
from gptcli.progress import SILENT, Progress, staged

FORMATS_IN = ("hf", "openai")
FORMATS_OUT = ("hf",)

_BLOCK_PARAMS = (  # the released per-block order, as Hugging Face names (Conv1D [in, out] weights)
    "attn.c_attn.weight",
    "attn.c_attn.bias",
    "attn.c_proj.weight",
    "attn.c_proj.bias",
    "ln_1.weight",
    "ln_1.bias",
    "mlp.c_fc.weight",
    "mlp.c_fc.bias",
    "mlp.c_proj.weight",
    "mlp.c_proj.bias",
    "ln_2.weight",
    "ln_2.bias",
)


@dataclass
class ConvertConfig:
    """One conversion: import Hugging Face or original OpenAI weights as a gpt1 checkpoint (``from_format``), or
    export a gpt1 checkpoint as a Hugging Face directory (``to_format``); exactly one of the two."""

    src: str | None = None
    """What to convert: a Hugging Face directory or Hub id (--from hf: ``openai-gpt``, ``owner/name[@revision]``,
    downloaded through huggingface_hub), an original release directory (--from openai), or a gpt1 checkpoint
    (--to hf)."""
    from_format: str | None = None
    """Import from: 'hf' (openai-gpt checkpoint: config.json + model.safetensors/pytorch_model.bin + vocab.json +
    merges.txt) or 'openai' (params_*.npy + params_shapes.json + the two BPE files)."""
    to_format: str | None = None
    """Export to: 'hf' (a directory transformers can load)."""
    out: Path | None = None
    """Directory to write: a gpt1 checkpoint (--from) or a Hugging Face directory (--to)."""
    n_head: int = 12
    """Attention heads (--from openai only; the release does not record it; GPT-1 has 12)."""
    tokenizer: Path | None = None
    """Directory with the BPE files if they are not next to the weights (--from openai only)."""
    overwrite: bool = False
    """Replace --out if it holds an earlier conversion's output of the same kind (anything else is refused)."""

    def check(self) -> None:
        """One-line errors for a conversion that cannot start (nothing is read or written before this)."""
        if self.src is None:
            raise GPT1Error("SRC is required: what to convert (a directory, hub id or checkpoint)")
        if (self.from_format is None) == (self.to_format is None):
            raise GPT1Error("give exactly one of --from (hf, openai) or --to (hf)")
        if self.from_format is not None and self.from_format not in FORMATS_IN:
            raise GPT1Error(f"--from {self.from_format!r}: expected one of {', '.join(FORMATS_IN)}")
        if self.to_format is not None and self.to_format not in FORMATS_OUT:
            raise GPT1Error(f"--to {self.to_format!r}: expected one of {', '.join(FORMATS_OUT)}")
        if self.out is None:
            raise GPT1Error("--out is required (the directory to write)")
        if self.n_head < 1:
            raise GPT1Error(f"--n-head must be at least 1, got {self.n_head}")
        check_output(Path(self.out), self.out_kind, overwrite=self.overwrite, inputs=self.inputs())

    @property
    def out_kind(self) -> str:
        """What ``out`` holds afterwards (and may already hold to be replaced with ``overwrite``)."""
        return "hf-export" if self.to_format == "hf" else "checkpoint"

    def inputs(self) -> list[Path]:
        """The paths the conversion reads (a hub id is no path): ``out`` may neither contain nor lie inside them."""
        return [Path(p) for p in (self.src, self.tokenizer) if p is not None and Path(p).exists()]


@dataclass
class ConvertResult:
    """What :func:`convert` wrote."""

    path: Path
    format: str
    """"gpt1" (a checkpoint, after an import) or "hf" (a Hugging Face directory, after an export)."""
    warnings: list[str]
    config: ModelConfig | None = None
    """The imported model's shape (imports only)."""
    params: int | None = None
    """The imported model's parameter count (imports only)."""


@dataclass
class Converted:
    """A converted model, its tokenizer (None if the source had none) and where it came from."""

    model: GPT
    tokenizer: Any | None
    meta: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


def _build(config: ModelConfig, hf_state: dict[str, torch.Tensor], where: Path) -> GPT:
    try:
        ours = state_dict_from_hf(hf_state, config.n_layer)
    except KeyError as e:
        raise GPT1Error(f"{where}: weight {e.args[0]!r} is missing") from None
    with torch.device("meta"):  # the config against the weights' shapes before the model is allocated
        expected = {k: tuple(v.shape) for k, v in GPT(config).state_dict().items()}
    wrong = sorted(
        k for k in expected.keys() | ours.keys() if expected.get(k) != (tuple(ours[k].shape) if k in ours else None)
    )
    if wrong:
        k = wrong[0]
        raise GPT1Error(
            f"{where}: weights do not match the config ({k}: the config asks for "
            f"{list(expected[k]) if k in expected else 'no such tensor'}, the weights have "
            f"{list(ours[k].shape) if k in ours else 'none'}; {len(wrong)} tensor(s) differ)"
        )
    model = GPT(config)
    try:
        model.load_state_dict({k: v.float() for k, v in ours.items()}, strict=True)
    except KeyError as e:
        raise GPT1Error(f"{where}: weight {e.args[0]!r} is missing") from None
    except RuntimeError as e:
        raise GPT1Error(f"{where}: weights do not match the config ({str(e).splitlines()[-1].strip()})") from None
    model.eval()
    return model


def _tokenizer_from(directory: Path, warnings: list[str] | None = None):
    """The original BPE in ``directory``: its two files, or else a ``tokenizer.json`` holding it (transformers 5
    saves only that); a ``tokenizer.json`` of another kind is a warning in ``warnings`` and None."""
    from gptcli.interop.hf_tokenizer import HF_TOKENIZER, read_original_bpe
    from gptcli.tokenizers.openai import FILE_NAMES, OpenAIBPETokenizer

    if any((directory / v).is_file() and (directory / m).is_file() for v, m in FILE_NAMES):
        return OpenAIBPETokenizer.from_dir(directory)
    if (directory / HF_TOKENIZER).is_file():
        bpe = read_original_bpe(directory / HF_TOKENIZER)
        if bpe is not None:
            return OpenAIBPETokenizer(*bpe)
        if warnings is not None:
            warnings.append(
                f"{directory / HF_TOKENIZER}: not GPT-1's BPE (a BPE with '</w>' word ends); "
                "the checkpoint is written without a tokenizer"
            )
    return None


# ---------------------------------------------------------------------------------------------- Hugging Face
def read_hf_weights(directory: Path) -> dict[str, torch.Tensor]:
    """``model.safetensors`` or, failing that, ``pytorch_model.bin`` loaded without unpickling code."""
    st = directory / "model.safetensors"
    if st.is_file():
        from safetensors.torch import load_file

        try:
            return load_file(str(st))
        except Exception as e:
            raise GPT1Error(f"{st}: unreadable safetensors file ({e})") from None
    pt = directory / "pytorch_model.bin"
    if pt.is_file():
        try:
            return torch.load(pt, map_location="cpu", weights_only=True)
        except Exception as e:
            raise GPT1Error(
                f"{pt}: not loadable as plain tensors with weights_only=True ({str(e).splitlines()[0]})"
            ) from None
    raise GPT1Error(f"{directory}: no model.safetensors or pytorch_model.bin")


def from_hf(src: str | Path) -> Converted:
    """A Hugging Face ``openai-gpt`` checkpoint directory as our model + original tokenizer."""
    d = _hf_directory(src)
    hf_cfg = read_hf_config(d)
    warnings: list[str] = []
    tok = _tokenizer_from(d, warnings)
    if tok is None and not warnings:
        warnings.append(
            f"{d}: no vocab.json + merges.txt or tokenizer.json; the checkpoint is written without a tokenizer"
        )
    try:
        shape = config_from_hf(hf_cfg)
    except (TypeError, ValueError) as e:  # e.g. n_head not dividing n_embd, or a size that is not a number
        raise DataError(d / "config.json", f"not a model GPT-1 can build ({e})") from None
    config = _split_special_rows(shape, tok, d / "config.json")
    sd = read_hf_weights(d)
    if "lm_head.weight" in sd:
        emb = sd.get("transformer.tokens_embed.weight", sd.get("tokens_embed.weight"))
        if emb is not None and not torch.equal(sd["lm_head.weight"], emb):
            raise GPT1Error(f"{d}: lm_head.weight is not tied to the token embedding (GPT-1 ties them)")
    model = _build(config, sd, d)
    meta = {"source": {"format": "hf", "path": str(src), "resolved": str(d)}}
    return Converted(model, tok, meta, warnings)


def _hf_directory(src: str | Path) -> Path:
    """``src`` as a local directory. A Hub id is resolved before this (``gpt1 convert --from hf ID``, or
    :func:`gptcli.interop.hub.download`), so the library only reads files."""
    d = Path(src)
    if not d.is_dir():
        raise GPT1Error(
            f"{src}: not a directory (expected a Hugging Face checkpoint directory; for a Hub id use "
            "`gpt1 convert --from hf OWNER/NAME` or gptcli.interop.hub)"
        )
    return d


def _split_special_rows(config: ModelConfig, tok: Any | None, where: Path) -> ModelConfig:
    """Hugging Face counts fine-tuning special rows as vocabulary; ours keeps them apart (``n_special``)."""
    if tok is not None and config.vocab_size > tok.vocab_size:
        # Rows past the BPE vocabulary are fine-tuning special tokens (e.g. a model we exported after finetune).
        config.n_special = config.vocab_size - tok.vocab_size
        config.vocab_size = tok.vocab_size
    elif tok is not None and config.vocab_size < tok.vocab_size:
        raise GPT1Error(f"{where}: vocab_size {config.vocab_size} is smaller than the tokenizer's {tok.vocab_size}")
    return config


# --------------------------------------------------------------------------------------- original release
def read_openai_params(directory: Path) -> list[torch.Tensor]:
    """Concatenate ``params_*.npy`` and cut the flat vector by ``params_shapes.json`` (the released loader)."""
    import numpy as np

    shapes_path = directory / "params_shapes.json"
    if not shapes_path.is_file():
        raise GPT1Error(f"{directory}: no params_shapes.json (not an original GPT-1 release directory)")
    try:
        shapes = json.loads(shapes_path.read_text(encoding="utf-8"))
        shapes = [[int(x) for x in s] for s in shapes]
    except (json.JSONDecodeError, TypeError, ValueError) as e:
        raise DataError(shapes_path, f"expected a JSON list of shapes ({e})") from None
    shards = []
    n = 0
    while (directory / f"params_{n}.npy").is_file():
        shards.append(directory / f"params_{n}.npy")
        n += 1
    if not shards:
        raise GPT1Error(f"{directory}: no params_0.npy … params_9.npy weight shards")
    arrays = []
    for p in shards:
        try:
            arrays.append(np.load(p, allow_pickle=False).reshape(-1))
        except Exception as e:
            raise GPT1Error(f"{p}: unreadable .npy file ({e})") from None
    flat = np.concatenate(arrays, 0)
    sizes = [int(np.prod(s)) for s in shapes]
    if sum(sizes) != flat.size:
        raise GPT1Error(
            f"{directory}: the {len(shards)} shards hold {flat.size} values but params_shapes.json needs {sum(sizes)}"
            " (a shard missing?)"
        )
    offsets = np.cumsum(sizes)[:-1]
    return [
        torch.from_numpy(np.ascontiguousarray(a.reshape(s))).float() for a, s in zip(np.split(flat, offsets), shapes)
    ]


def from_openai(
    src: str | Path, *, n_head: int = 12, tokenizer_dir: str | Path | None = None, n_special: int = 3
) -> Converted:
    """The original release (``params_*.npy`` + ``params_shapes.json`` + the two BPE files) as our model.

    ``n_head`` is not recorded in the release (12 for GPT-1). ``n_special`` matters only for a params file saved
    from the fine-tuning graph, whose first matrix stacks tokens, ``n_special`` special rows and positions.

    The original release's layout (``finetune-transformer-lm/train.py``): the shards are pieces of one flat float32
    vector; cutting it at the cumulative sizes of ``params_shapes.json`` gives, in order, the position embedding
    [n_ctx, d], the token embedding [n_vocab, d], then per block ``c_attn w [1, d, 3d], b``, ``c_proj w [1, d, d], b``,
    ``ln_1 g, b``, ``c_fc w [1, d, 4d], b``, ``c_proj w [1, 4d, d], b``, ``ln_2 g, b`` (TensorFlow variable creation
    order). The fine-tuning graph then builds one matrix ``we`` = [tokens; 3 specials; positions]; a params file saved
    from that graph therefore starts with a single [n_vocab + n_special + n_ctx, d] matrix, which we also accept.
    """
    d = Path(src)
    if not d.is_dir():
        raise GPT1Error(f"{d}: not a directory")
    tok_dir = Path(tokenizer_dir) if tokenizer_dir is not None else d
    tok = _tokenizer_from(tok_dir)
    where = d / "params_shapes.json"
    parts = _release_parts(read_openai_params(d), tok, tok_dir, n_special, where)
    n_layer = len(parts.blocks) // 12
    n_embd = parts.tokens.size(1)
    if tok is None:
        warnings = [
            f"{tok_dir}: no BPE files (encoder_bpe_40000.json + vocab_40000.bpe or vocab.json + merges.txt);"
            " the checkpoint is written without a tokenizer"
        ]
    else:
        warnings = []
        if tok.vocab_size != parts.tokens.size(0):
            raise GPT1Error(
                f"{tok_dir}: tokenizer has {tok.vocab_size} ids but the token embedding has {parts.tokens.size(0)} rows"
            )
    _check_heads(n_embd, n_head, where)
    inner = parts.blocks[6].shape[-1] if n_layer else 4 * n_embd
    config = ModelConfig(
        vocab_size=parts.tokens.size(0),
        n_special=parts.specials.size(0),
        n_ctx=parts.pos.size(0),
        n_embd=n_embd,
        n_layer=n_layer,
        n_head=n_head,
        n_inner=int(inner),
    )
    model = _build(config, parts.hf_state(), where)
    meta = {
        "source": {
            "format": "openai",
            "path": str(d),
            "layout": parts.layout,
            "shards": len(list(d.glob("params_*.npy"))),
        }
    }
    return Converted(model, tok, meta, warnings)


def _check_heads(n_embd: int, n_head: int, where: Path) -> None:
    """The release does not record the head count; one that does not divide the width cannot be right."""
    if n_embd % n_head == 0:
        return
    fits = [h for h in range(1, n_embd + 1) if n_embd % h == 0]
    # GPT-1's heads are 64 wide: suggest that count when it fits, else the divisor nearest the one given.
    guess = n_embd // 64 if n_embd % 64 == 0 else min(fits, key=lambda h: (abs(h - n_head), h))
    raise GPT1Error(
        f"{where}: the model is {n_embd} wide, which --n-head {n_head} does not divide "
        f"(pass --n-head with a divisor of {n_embd}, e.g. --n-head {guess})"
    )


@dataclass
class _ReleaseParts:
    """The release's arrays by role: embeddings, then 12 arrays per block in the released order."""

    tokens: torch.Tensor
    specials: torch.Tensor
    pos: torch.Tensor
    blocks: list[torch.Tensor]
    layout: str
    """"separate" (the pretrained release) or "stacked" (a params file of the fine-tuning graph)."""

    def hf_state(self) -> dict[str, torch.Tensor]:
        """The same weights under Hugging Face's names (Conv1D weights as [in, out])."""
        state = {"tokens_embed.weight": torch.cat([self.tokens, self.specials], 0), "positions_embed.weight": self.pos}
        for i in range(len(self.blocks) // 12):
            for j, name in enumerate(_BLOCK_PARAMS):
                t = self.blocks[12 * i + j]
                state[f"h.{i}.{name}"] = t.reshape(t.shape[-2:]) if t.dim() == 3 else t  # drop the conv width 1
        return state


def _release_parts(
    params: list[torch.Tensor], tok: Any | None, tok_dir: Path, n_special: int, where: Path
) -> _ReleaseParts:
    """Tell the two layouts apart by their first arrays and cut the embeddings out."""
    if len(params) >= 2 and params[0].dim() == 2 and params[1].dim() == 2 and (len(params) - 2) % 12 == 0:
        pos, tokens = params[0], params[1]  # the pretrained release: positions first, then tokens
        return _ReleaseParts(tokens, tokens.new_zeros(0, tokens.size(1)), pos, params[2:], "separate")
    if len(params) >= 1 and params[0].dim() == 2 and (len(params) - 1) % 12 == 0:
        if tok is None:
            raise GPT1Error(f"{tok_dir}: a stacked embedding matrix needs the BPE files to know where tokens end")
        we = params[0]
        n_vocab = tok.vocab_size
        if we.size(0) <= n_vocab + n_special:
            raise DataError(
                where,
                f"first matrix has {we.size(0)} rows, too few for {n_vocab} tokens + {n_special} specials + positions",
            )
        return _ReleaseParts(
            we[:n_vocab], we[n_vocab : n_vocab + n_special], we[n_vocab + n_special :], params[1:], "stacked"
        )
    raise DataError(where, f"{len(params)} arrays do not match the GPT-1 layout (2 embeddings + 12 per block)")


# ------------------------------------------------------------------------------------------------- output
def convert_to_checkpoint(converted: Converted, out: str | Path) -> Path:
    """Save a converted model as an ordinary gpt1 checkpoint (kind ``lm``)."""
    meta = dict(converted.meta)
    meta["converted_by"] = "gpt1 convert"
    source = Path(str(meta.get("source", {}).get("resolved") or meta.get("source", {}).get("path") or ""))
    # The CLI checked already (with its --overwrite); this guards library callers: never replace a foreign folder.
    check_output(Path(out), "checkpoint", overwrite=True, inputs=[source] if source.parts else [])
    return save_checkpoint(
        out, converted.model, converted.tokenizer, kind="lm", meta=meta, extra=lambda tmp: mark(tmp, "checkpoint")
    )


def to_hf(ckpt: str | Path, out: str | Path) -> tuple[Path, list[str]]:
    """Write checkpoint ``ckpt`` as a Hugging Face ``openai-gpt`` directory; returns (dir, warnings).

    Weights and config always. The tokenizer as ``tokenizer.json`` (+ ``tokenizer_config.json``) that
    ``AutoTokenizer`` loads without remote code, for the original BPE and a learned sentencepiece one alike
    (:mod:`gptcli.interop.hf_tokenizer`: the closest construction of gpt1's pipeline in ``tokenizers``); the original
    BPE also as ``vocab.json`` + ``merges.txt`` for ``OpenAIGPTTokenizer``. Task heads are not exported.
    """

    check_output(Path(out), "hf-export", overwrite=True, inputs=[Path(ckpt)])  # library callers too
    header = read_header(ckpt)
    if header.arch != "transformer":
        raise GPT1Error(
            f"{header.path}: an {header.arch} checkpoint cannot be exported (Hugging Face openai-gpt is "
            "the GPT-1 Transformer; only Transformer checkpoints convert)"
        )
    c = load_checkpoint(ckpt)
    cfg = cast(ModelConfig, c.config)  # the header's arch is the Transformer's (checked above)
    if cfg.n_inner != 4 * cfg.n_embd:
        raise GPT1Error(f"{c.path}: n_inner={cfg.n_inner} ≠ 4·n_embd; Hugging Face openai-gpt cannot represent it")
    sd = state_dict_to_hf(c.model.state_dict(), cfg.n_layer)
    # Tied: transformers re-ties lm_head to the embedding on load, and safetensors refuses shared storage.
    sd.pop("lm_head.weight")
    sd = {k: v.detach().float().contiguous().clone() for k, v in sd.items()}
    tok = c.tokenizer
    from gptcli.interop.hf_tokenizer import EXPORTABLE, special_token_ids, write_hf_tokenizer

    exported = tok if tok is not None and getattr(tok, "kind", None) in EXPORTABLE else None

    def write(tmp: Path) -> None:
        mark(tmp, "hf-export")  # inside the temporary directory: a marked export is always a whole one
        save_tensors(sd, tmp / "model.safetensors", metadata={"format": "pt"})  # a full disk is an OSError
        write_hf_config(tmp, cfg, special_tokens=special_token_ids(exported) if exported is not None else None)
        if exported is not None:
            write_hf_tokenizer(tmp, exported, cfg.n_ctx)
            if exported.kind == "openai":
                exported.save_bpe_files(tmp)

    warnings = _export_warnings(c)
    path = atomic_directory(Path(out), write)
    return path, warnings


def _export_warnings(c: Checkpoint) -> list[str]:
    """What a Hugging Face export of checkpoint ``c`` leaves out or cannot name."""
    cfg, tok = c.config, c.tokenizer
    warnings: list[str] = []
    if c.kind != "lm" or c.head_state:
        warnings.append(f"{c.path}: kind {c.kind!r}; only the language model is exported, not the task head")
    if cfg.n_special:
        warnings.append(
            f"{cfg.n_special} special-token rows are exported as ids {cfg.vocab_size}…"
            f"{cfg.total_vocab - 1} (vocab_size {cfg.total_vocab}); the tokenizer files do not name them"
        )
    if tok is None:
        warnings.append(f"{c.path}: the checkpoint has no tokenizer; none is exported")
    elif getattr(tok, "kind", None) not in ("openai", "sentencepiece"):
        warnings.append(
            f"tokenizer kind {tok.kind!r} is not exported (only the original BPE and a learned sentencepiece "
            f"BPE have a Hugging Face form); keep using {c.path}/tokenizer with gpt1"
        )
    return warnings


# ------------------------------------------------------------------------------------------------- the command
def convert(cfg: ConvertConfig, progress: Progress | None = None) -> ConvertResult:
    """Run one conversion as ``cfg`` describes it (checked first: :meth:`ConvertConfig.check`); ``progress`` hears
    one stage, ``convert SRC``, without a size (reading and writing the weights is one step)."""
    cfg.check()
    assert cfg.src is not None and cfg.out is not None  # checked above
    with output_lock(cfg.out):
        cfg.check()  # again, now that no other run can be writing there
        with staged(progress or SILENT, f"convert {cfg.src}"):
            return _convert(cfg)


def _convert(cfg: ConvertConfig) -> ConvertResult:
    assert cfg.src is not None and cfg.out is not None
    if cfg.to_format == "hf":
        path, warnings = to_hf(cfg.src, cfg.out)
        return ConvertResult(path, "hf", warnings)
    if cfg.from_format == "hf":
        converted = from_hf(cfg.src)
    else:
        converted = from_openai(cfg.src, n_head=cfg.n_head, tokenizer_dir=cfg.tokenizer)
    path = convert_to_checkpoint(converted, cfg.out)
    return ConvertResult(path, "gpt1", converted.warnings, converted.model.config, converted.model.num_params())
