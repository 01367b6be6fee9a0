"""The suite: every check, in the order a run takes them.

Cheapest and most telling first, the long throughput runs last, so that a run the deadline cuts short loses the
least. The check modules register their checks on import; this module orders them by name.
"""

from __future__ import annotations

from . import check_commands, check_compile, check_device, check_packed, check_parity, check_throughput  # noqa: F401
from .registry import REGISTERED, Check

ORDER = [
    "env",
    "gpus_refusal",
    "attention_kernel",
    "fused_adamw",
    "precision_steps",
    "lstm_dtype",
    "kv_cache_parity",
    "packed_finetune",
    "host_syncs",
    "corpus",
    "launched_vs_inprocess",
    "resume",
    "out_of_memory",
    "finetune_eval_zeroshot",
    "compile_loss",
    "cudagraphs_training",
    # 8 × 512 (an 8-GPU run's share) and 64 × 512 (the paper's batch) first, 32 × 512 last. Between them the chunked
    # loss, then the kernels of a compiled update and the padded head.
    "throughput_8x512_eager",
    "throughput_8x512_compile",
    "throughput_8x512_cudagraphs",
    "throughput_64x512_eager",
    "throughput_64x512_compile",
    "throughput_64x512_cudagraphs",
    "chunked_loss",
    "step_profile",
    "padded_head",
    "throughput_32x512_eager",
    "throughput_32x512_compile",
    # max-autotune last of all: its search makes the first update minutes long.
    "throughput_8x512_autotune",
    "throughput_64x512_autotune",
]

CHECKS: list[Check] = sorted(REGISTERED, key=lambda c: ORDER.index(c.name))
