"""The compiled elementwise kernels (GELU, dropout) of this checkout's library against PyTorch's ops and, optionally,
against another build of the library (an older commit's, from the kernel cache), same process, same inputs.

A change to how the library is compiled (``gptcli.model.kernels.native.flags``) or to its loops shows here first:
each variant's forward + backward at GPT-1's training shapes, timed round-robin, and a check that the two builds
compute bit-identical outputs (it fails loudly where they do not).

- ``gelu``: the tanh-GELU on one MLP activation (2,048 × 3,072), forward and backward, vs ``F.gelu`` and its backward;
- ``dropout attention`` and ``dropout residual``: one dropout of a layer's attention probabilities (the 5/8 of
  4 × 12 × 512² the chunked attention computes) and of a residual branch (4 × 512 × 768), applied twice as forward
  and backward do, vs ``F.dropout``.

::

    python benchmarks/kernel_builds.py --steps 9 --json builds.json
    python benchmarks/kernel_builds.py --before ~/.cache/gpt1/kernels/gpt1_cpu_kernels_<digest>/gpt1_cpu_kernels_<digest>.so
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from _machine import add_machine_args, machine_header, round_robin, start, write_json


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=9, help="timed rounds (after one warm-up)")
    ap.add_argument("--before", type=Path, help="another build's .so to compare with (an older kernel cache entry)")
    add_machine_args(ap)
    args = ap.parse_args()
    start(args)

    from gptcli.model.kernels import native

    info, line = machine_header()
    print(line)
    builds = {"now": native.library()}
    if builds["now"] is None:
        raise SystemExit(f"error: the compiled library is not available here ({native.unavailable()})")
    print(
        f"now: {native.build_name()} (flags {' '.join(native.flags())}; vector row loops: {builds['now'].vector_isa() or 'none'})"
    )
    if args.before is not None:
        builds["before"] = _load(args.before)
        _check_identical(builds["now"], builds["before"])
        print(f"before: {args.before.name}; outputs bit-identical to now's (GELU forward and backward, dropout)")
    cases = _cases(builds)
    variants = [(case, impl) for case in cases for impl in cases[case]]
    times = round_robin(lambda case, impl: _timed(cases[case][impl]), variants, args.steps)
    rows = []
    for case, impls in cases.items():
        stock = statistics.median(times[(case, "stock")]) * 1e3
        for impl in impls:
            ms = statistics.median(times[(case, impl)]) * 1e3
            rows.append({"case": case, "impl": impl, "ms": ms, "stock_over_impl": stock / ms})
            print(f"  {case:32s} {impl:6s} {ms:8.1f} ms  {stock / ms:5.2f}× stock")
    write_json(
        args.json,
        info,
        rows=rows,
        args={**vars(args), "before": str(args.before) if args.before else None},
        build=native.build_name(),
        flags=native.flags(),
    )


def _load(path: Path):
    """A built library file imported under its own name (the name PyTorch's builder gave it), as ``native`` imports
    a cached build."""
    from gptcli.model.kernels import native

    module = native._import_built(path.parent, path.stem) if path.suffix == ".so" else None
    if module is None:
        raise SystemExit(f"error: cannot import {path} (give the .so file of a kernel cache entry)")
    return module


def _inputs() -> dict:
    import torch

    g = torch.Generator().manual_seed(0)
    shapes = {"mlp": (2048, 3072), "attention": (4, 12, 320, 512), "residual": (4, 512, 768)}
    return {name: torch.randn(shape, generator=g) for name, shape in shapes.items()}


def _check_identical(now, before) -> None:
    import torch

    from gptcli.model.kernels.dropout import threshold

    x = _inputs()
    for dtype in (torch.float32, torch.bfloat16):
        a, b, t = x["mlp"].to(dtype), x["mlp"].flip(0).to(dtype), x["attention"].to(dtype)
        pairs = [
            (now.gelu_forward(a), before.gelu_forward(a)),
            (now.gelu_backward(b, a), before.gelu_backward(b, a)),
            (
                now.dropout_apply(t, 99, threshold(0.1), 1 / 0.9, torch.empty_like(t)),
                before.dropout_apply(t, 99, threshold(0.1), 1 / 0.9, torch.empty_like(t)),
            ),
        ]
        for p, q in pairs:
            if not torch.equal(p, q):
                raise SystemExit(f"error: the two builds differ in {dtype} (the compiled code changed its results)")


def _cases(builds: dict) -> dict:
    """{case: {impl: zero-argument callable}}; ``stock`` is PyTorch's own op."""
    import torch
    import torch.nn.functional as F

    from gptcli.model.kernels.dropout import threshold

    x, cases = _inputs(), {}
    t = threshold(0.1)
    for dtype, tag in ((torch.float32, "fp32"), (torch.bfloat16, "bf16")):
        a, b = x["mlp"].to(dtype), x["mlp"].flip(0).to(dtype)
        gelu = {
            "stock": lambda a=a, b=b: (
                F.gelu(a, approximate="tanh"),
                torch.ops.aten.gelu_backward(b, a, approximate="tanh"),
            )
        }
        for name, lib in builds.items():
            gelu[name] = lambda a=a, b=b, lib=lib: (lib.gelu_forward(a), lib.gelu_backward(b, a))
        cases[f"gelu {tag}"] = gelu
        for part in ("attention", "residual"):
            y = x[part].to(dtype)
            drop = {"stock": lambda y=y: (F.dropout(y, 0.1, True), F.dropout(y, 0.1, True))}
            for name, lib in builds.items():
                drop[name] = lambda y=y, lib=lib: [
                    lib.dropout_apply(y, s, t, 1 / 0.9, torch.empty_like(y)) for s in (1, 2)
                ]
            cases[f"dropout {part} {tag}"] = drop
    return cases


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


if __name__ == "__main__":
    main()
