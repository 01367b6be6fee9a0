"""The training state a step checkpoint carries beside the model.

A step checkpoint is a checkpoint (:mod:`gptcli.checkpoint`: weights, tokenizer, config.json with checksums) plus
two files that only a resume reads::

    training_state.json          the job's position (step, sampler or epoch), optimizer hyper-parameters, RNG states
    optimizer.safetensors        every optimizer state tensor as "state.<param index>.<name>", plus RNG byte states

Both load without executing code; the optimizer state maps back through parameter *indices*, the same order
``torch.optim.Optimizer.state_dict`` uses. The step directories themselves (named, pruned, removed) belong to the
run directory (:mod:`gptcli.train.run.directory`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

import torch
from safetensors.torch import load_file

from gptcli.checkpoint import FORMAT, check_intact, save_tensors
from gptcli.errors import GPT1Error

TRAINING_STATE = "training_state.json"
OPTIMIZER = "optimizer.safetensors"


def rng_state() -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """(JSON part, tensor part) of every RNG a training step may consume: Python, numpy, torch CPU and CUDA."""
    import random

    import numpy as np

    py_version, py_state, py_gauss = random.getstate()
    # the default (legacy) form of numpy's state is this tuple; the dict form is asked for by legacy=False only
    legacy = cast(tuple[str, np.ndarray, int, int, float], np.random.get_state())
    np_name, np_keys, np_pos, np_has_gauss, np_gauss = legacy
    js = {
        "python": [py_version, list(py_state), py_gauss],
        "numpy": [np_name, np_keys.tolist(), int(np_pos), int(np_has_gauss), float(np_gauss)],
    }
    tensors = {"rng.torch_cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"rng.torch_cuda.{i}"] = s
    return js, tensors


def set_rng_state(js: dict[str, Any], tensors: dict[str, torch.Tensor]) -> None:
    import random

    import numpy as np

    if "python" in js:
        v, state, gauss = js["python"]
        random.setstate((v, tuple(state), gauss))
    if "numpy" in js:
        name, keys, pos, has_gauss, gauss = js["numpy"]
        np.random.set_state((name, np.array(keys, dtype=np.uint32), pos, has_gauss, gauss))
    if "rng.torch_cpu" in tensors:
        torch.set_rng_state(tensors["rng.torch_cpu"])
    cuda = [tensors[k] for k in sorted(tensors) if k.startswith("rng.torch_cuda.")]
    if cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(cuda[: torch.cuda.device_count()])


def write_training_state(
    directory: Path,
    optimizer: torch.optim.Optimizer,
    state: dict[str, Any],
    *,
    scaler: Any | None = None,
) -> None:
    """Write the optimizer, RNG states and the JSON ``state`` (step, sampler, ...) into ``directory``."""
    sd = optimizer.state_dict()
    tensors: dict[str, torch.Tensor] = {}
    for idx, pstate in sd["state"].items():
        for name, value in pstate.items():
            t = value if isinstance(value, torch.Tensor) else torch.tensor(value)
            tensors[f"state.{idx}.{name}"] = t.detach().to("cpu").contiguous()
    rng_js, rng_t = rng_state()
    tensors.update(rng_t)
    save_tensors(tensors, Path(directory) / OPTIMIZER, metadata={"format": str(FORMAT)})
    groups = [{k: (list(v) if isinstance(v, tuple) else v) for k, v in g.items()} for g in sd["param_groups"]]
    doc = {"format": FORMAT, **state, "optimizer_param_groups": groups, "rng": rng_js}
    if scaler is not None and scaler.is_enabled():
        doc["grad_scaler"] = {k: (float(v) if isinstance(v, float) else v) for k, v in scaler.state_dict().items()}
    (Path(directory) / TRAINING_STATE).write_text(json.dumps(doc, indent=1), encoding="utf-8")


def has_training_state(path: Path) -> bool:
    return (path / TRAINING_STATE).is_file() and (path / OPTIMIZER).is_file()


def read_training_state(path: str | Path, *, verify: bool = True) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """The JSON training state and the tensors (optimizer + RNG) of a checkpoint, with one-line errors."""
    p = Path(path)
    if verify:
        check_intact(p)
    if not has_training_state(p):
        raise GPT1Error(
            f"{p}: checkpoint has no training state ({TRAINING_STATE} + {OPTIMIZER}); cannot resume from it"
        )
    try:
        doc = json.loads((p / TRAINING_STATE).read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise GPT1Error(f"{p / TRAINING_STATE}: corrupt training state ({e})") from None
    try:
        tensors = load_file(str(p / OPTIMIZER))
    except Exception as e:
        raise GPT1Error(f"{p / OPTIMIZER}: unreadable optimizer state ({e})") from None
    step = doc.get("step") if isinstance(doc, dict) else None
    if not isinstance(doc, dict) or not _is_count(step):
        raise GPT1Error(
            f"{p / TRAINING_STATE}: step {step!r} is not a count of updates (the training state is damaged: resume "
            "from another checkpoint, or start over)"
        )
    return doc, tensors


STEP_LIMIT = 2**53  # more updates than any run makes, and the last count a float holds exactly


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < STEP_LIMIT


def moment_problem(state: dict[int, dict[str, torch.Tensor]], optimizer: torch.optim.Optimizer) -> str | None:
    """Why optimizer ``state`` (parameter index → tensors) cannot belong to ``optimizer``'s parameters: a state for a
    parameter it does not have, or a moment of another shape (``load_state_dict`` checks neither, and a moment of the
    wrong shape would broadcast into the update); None when it can."""
    params = [p for g in optimizer.param_groups for p in g["params"]]
    for idx, tensors in sorted(state.items()):
        if not 0 <= idx < len(params):
            return f"a state for parameter {idx}, of {len(params)}"
        for name, t in tensors.items():
            if name != "step" and t.shape != params[idx].shape:
                return f"{name} of parameter {idx} has shape {tuple(t.shape)}, the parameter {tuple(params[idx].shape)}"
            if name == "step" and (t.numel() != 1 or not 0 <= float(t) < STEP_LIMIT):
                return f"the step count of parameter {idx} is {t.flatten()[:1].tolist()}"
    return None


def restore_training_state(
    doc: dict[str, Any],
    tensors: dict[str, torch.Tensor],
    optimizer: torch.optim.Optimizer,
    *,
    scaler: Any | None = None,
    restore_rng: bool = True,
) -> None:
    """Load optimizer (and GradScaler) state and the RNG states read by :func:`read_training_state`."""
    groups = doc["optimizer_param_groups"]
    for g in groups:
        if "betas" in g:
            g["betas"] = tuple(g["betas"])
    state: dict[int, dict[str, torch.Tensor]] = {}
    for key, t in tensors.items():
        if not key.startswith("state."):
            continue
        _, idx, name = key.split(".", 2)
        state.setdefault(int(idx), {})[name] = t
    problem = moment_problem(state, optimizer)
    if problem is not None:
        raise GPT1Error(f"optimizer state does not match the model ({problem}): resume from another checkpoint")
    try:
        optimizer.load_state_dict({"state": state, "param_groups": groups})
    except (ValueError, KeyError, RuntimeError) as e:
        raise GPT1Error(f"optimizer state does not match the model ({e})") from None
    if scaler is not None and "grad_scaler" in doc:
        scaler.load_state_dict(doc["grad_scaler"])
    if restore_rng:
        set_rng_state(doc.get("rng", {}), tensors)
