"""kernels/casts.py: the AMX forms' weight copies, made once per region and again after a weight changes."""

from __future__ import annotations

import torch

from gptcli.model.kernels import casts


def _counting():
    calls = []

    def make(w: torch.Tensor) -> torch.Tensor:
        calls.append(1)
        return w.to(torch.bfloat16)

    return make, calls


def test_outside_a_region_every_call_casts() -> None:
    make, calls = _counting()
    w = torch.randn(4, 3)
    casts.copy_of(w, "bf16", make)
    casts.copy_of(w, "bf16", make)
    assert len(calls) == 2


def test_inside_a_region_one_copy_per_weight_and_kind_until_the_weight_changes() -> None:
    make, calls = _counting()
    w, v = torch.randn(4, 3), torch.randn(4, 3)
    with casts.shared_copies():
        first = casts.copy_of(w, "bf16", make)
        assert casts.copy_of(w, "bf16", make) is first
        assert len(calls) == 1
        casts.copy_of(v, "bf16", make)  # another weight
        casts.copy_of(w, "other", make)  # another kind of copy
        assert len(calls) == 3
        with torch.no_grad():
            w.mul_(2.0)  # written in place: its version counter moves
        again = casts.copy_of(w, "bf16", make)
        assert len(calls) == 4
        assert torch.equal(again, (first.float() * 2.0).bfloat16())
        with casts.shared_copies():  # a nested region shares the outer one's copies
            assert casts.copy_of(w, "bf16", make) is again
    assert len(calls) == 4
    casts.copy_of(w, "bf16", make)  # the region ended: its copies are gone
    assert len(calls) == 5


def test_a_region_ends_even_when_its_body_raises() -> None:
    make, calls = _counting()
    w = torch.randn(2, 2)
    try:
        with casts.shared_copies():
            casts.copy_of(w, "bf16", make)
            raise RuntimeError("a failed micro-batch")
    except RuntimeError:
        pass
    casts.copy_of(w, "bf16", make)
    assert len(calls) == 2
