"""The package's shape, checked: rooms import downwards only, no cycles, UI stays in the command layer, private
torch/Typer names and the fast CPU kernels stay in the model's kernels room (which the model never imports), no
function over 80 lines and no module over 750 (an alarm, not a reason to split).

Every rule reads the source with ``ast`` (function-local imports included), so it holds whether or not a code path
runs. docs/architecture.md draws the same rooms; when a rule here changes, change the picture too.
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "gptcli"

# Rooms from the bottom up: a module may import its own room and lower ones, never a higher one.
# "ground" is the shared floor (errors, config, runtime, filesystem, progress protocol).
RANKS: dict[str, int] = {
    "ground": 0,
    "model": 1,
    "tokenizers": 1,
    "checkpoint": 2,
    "data": 2,
    "tasks": 2,
    "train": 3,
    "eval": 3,
    "interop": 3,
    "pipelines": 4,
    "commands": 5,
    "cli": 5,
    "__main__": 5,
}
GROUND = {
    "errors",
    "config",
    "system",  # torch_floor, runtime, allocator
    "files",  # fsutil, outputs, locks
    "progress",
    "guide",
    "padding",
    "__init__",
}
UI_PACKAGES = ("typer", "rich", "click")
MAX_FUNCTION_LINES = 80
# An alarm for a module that may hold more than one concept (lines as `ruff format` lays them out); files are split by
# concept, never to get under this number.
MAX_MODULE_LINES = 750
# The run machinery (gptcli/train/run/): what every training run shares is defined there once, each job supplying
# only what differs (its inputs, its loss, its checkpoint's extra state) — never a second copy of the rule itself.
ONE_DEFINITION = {
    "check_resume": "gptcli.train.run.resume",  # the refusal that names every change of a resumed run
    "resume_point": "gptcli.train.run.directory",  # which checkpoint a resume continues from
    "diverged": "gptcli.train.run.loop",  # the non-finite policy: one error, naming the last good checkpoint
    "NonFiniteWatch": "gptcli.train.run.loop",
    "NonFiniteLossError": "gptcli.train.run.loop",
    "plan_run_dir": "gptcli.train.run.directory",
    "reopen_metrics": "gptcli.train.run.directory",  # metrics.jsonl cut back on resume
    "RunState": "gptcli.train.run.loop",
}
# The fast CPU kernels' room inside the model (gptcli/model/kernels/): the one place that may use private torch
# functions, applied to a built model from outside (gptcli.model.kernels.apply); the model imports nothing of it.
KERNELS = "gptcli.model.kernels"
PRIVATE_ROOTS = ("torch", "typer", "click")


def _modules() -> dict[str, Path]:
    out = {}
    for p in sorted(PKG.rglob("*.py")):
        parts = p.relative_to(PKG.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = p
    return out


MODULES = _modules()


def _imports(path: Path, module: str) -> list[tuple[str, int]]:
    """(imported module, line) for every import in the file, at any depth; ``from pkg import sub`` resolves to
    the submodule when ``sub`` is one."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    is_pkg = path.name == "__init__.py"
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base[: len(base) - node.level + (1 if is_pkg else 0)]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            for a in node.names:
                sub = f"{name}.{a.name}"
                found.append((sub if sub in MODULES else name, node.lineno))
    return found


def _room(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "ground"
    head = parts[1]
    if head in GROUND:
        return "ground"
    return head


def _internal_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for mod, path in MODULES.items():
        graph[mod] = {m for m, _ in _imports(path, mod) if m in MODULES and m != mod}
    return graph


def test_every_module_is_in_a_known_room() -> None:
    unknown = sorted({_room(m) for m in MODULES} - set(RANKS))
    assert not unknown, (
        f"modules outside the rooms of RANKS: {unknown} (add the room, with its rank, and to docs/architecture.md)"
    )


def test_rooms_import_downwards_only() -> None:
    bad = []
    for mod, path in MODULES.items():
        rank = RANKS[_room(mod)]
        for imported, line in _imports(path, mod):
            if imported.startswith("gptcli") and imported in MODULES and RANKS[_room(imported)] > rank:
                bad.append(
                    f"{path.relative_to(PKG.parent)}:{line}: {_room(mod)} imports {imported} ({_room(imported)})"
                )
    assert not bad, "a lower room imports a higher one:\n" + "\n".join(bad)


def test_no_import_cycles() -> None:
    graph = _internal_graph()
    state: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                cycles.append(" -> ".join(stack[stack.index(n) :] + [n]))
            elif n not in state:
                visit(n)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_ui_libraries_only_in_the_command_layer() -> None:
    bad = []
    for mod, path in MODULES.items():
        if _room(mod) in ("commands", "cli", "__main__"):
            continue
        for imported, line in _imports(path, mod):
            if imported.split(".")[0] in UI_PACKAGES:
                bad.append(f"{path.relative_to(PKG.parent)}:{line}: imports {imported}")
    assert not bad, "Typer/Rich outside commands/ and cli.py:\n" + "\n".join(sorted(set(bad)))


def _functions(path: Path):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node


def test_library_functions_fit_on_a_screen() -> None:
    long = []
    for path in MODULES.values():
        for fn in _functions(path):
            n = fn.end_lineno - fn.lineno + 1
            if n > MAX_FUNCTION_LINES:
                long.append(f"{path.relative_to(PKG.parent)}:{fn.lineno}: {fn.name} has {n} lines")
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines (split them into named stages):\n" + "\n".join(long)


def test_modules_fit_in_a_head() -> None:
    """No module over MAX_MODULE_LINES lines: one a newcomer can hold in their head."""
    sizes = {
        path.relative_to(PKG.parent).as_posix(): len(path.read_text(encoding="utf-8").splitlines())
        for path in MODULES.values()
    }
    long = [f"{name}: {n} lines" for name, n in sorted(sizes.items()) if n > MAX_MODULE_LINES]
    assert not long, f"modules over {MAX_MODULE_LINES} lines (split them by concept, one per file):\n" + "\n".join(long)


def _definitions() -> dict[str, list[str]]:
    """Every function and class name defined anywhere in gptcli (methods and nested ones too), with its modules."""
    found: dict[str, list[str]] = {}
    for mod, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                found.setdefault(node.name.lstrip("_"), []).append(mod)
    return found


MAX_TOP_LEVEL_MODULES = 12


def test_the_top_level_stays_small() -> None:
    """The package's top level holds the few modules every room shares; the rest live in rooms (files/, system/, …)."""
    top = sorted(p.name for p in PKG.glob("*.py"))
    assert len(top) <= MAX_TOP_LEVEL_MODULES, (
        f"{len(top)} modules at gptcli/'s top level (group them into a room): {top}"
    )


def test_the_run_machinery_is_defined_once() -> None:
    """Pretraining and fine-tuning share one resume check, one resume-point choice, one non-finite policy, one
    run-state object: each defined once, in gptcli/train/run/, and nowhere else under any spelling of its name."""
    defs = _definitions()
    wrong = {name: defs.get(name, []) for name, home in ONE_DEFINITION.items() if defs.get(name, []) != [home]}
    assert not wrong, f"defined elsewhere too, or not where expected: {wrong}"


def test_tests_mirror_the_package() -> None:
    tests = Path(__file__).resolve().parent
    rooms = {p.name for p in PKG.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
    missing = sorted(r for r in rooms if not (tests / r).is_dir())
    assert not missing, f"tests/ has no folder for the package's rooms {missing}"


def test_public_names_still_import() -> None:
    import gptcli

    for name in ("GPT", "ModelConfig", "load_checkpoint", "open_corpus", "get_task", "Tokenizer", "save_checkpoint"):
        assert getattr(gptcli, name) is not None


# The library's entry points: each takes its config (and what it runs over) first, then ``progress``, positional or
# keyword, as docs/architecture.md's progress convention says. (pretrain's progress was keyword-only, convert took
# none.)
ENTRY_POINTS = [
    ("gptcli.data.prepare", "prepare", 1),
    ("gptcli.train.pretrain", "pretrain", 1),
    ("gptcli.train.finetune", "finetune", 1),
    ("gptcli.eval.zeroshot", "zeroshot", 1),
    ("gptcli.eval.curve", "run_curve", 2),
    ("gptcli.eval.tasks", "evaluate_tasks", 1),
    ("gptcli.pipelines.generate", "start_generation", 1),
    ("gptcli.pipelines.quickstart", "quickstart", 1),
    ("gptcli.interop.convert", "convert", 1),
    ("gptcli.interop.datasets", "fetch", 1),
]


@pytest.mark.parametrize("module, name, at", ENTRY_POINTS, ids=[e[1] for e in ENTRY_POINTS])
def test_entry_points_take_progress_after_their_inputs(module: str, name: str, at: int) -> None:
    import importlib
    import inspect

    signature = inspect.signature(getattr(importlib.import_module(module), name))
    params = list(signature.parameters.values())
    assert params[at].name == "progress" and params[at].default is None, f"{name}{signature}"
    assert params[at].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD, f"{name}: progress must be positional too"


@pytest.mark.parametrize(
    "module",
    sorted(
        m
        for m in MODULES
        if m.startswith("gptcli.commands.")
        and m not in ("gptcli.commands.options", "gptcli.commands.render", "gptcli.commands.defaults")
    ),
)
def test_each_command_module_defines_one_command(module: str) -> None:
    import importlib

    mod = importlib.import_module(module)
    assert callable(getattr(mod, "command", None)), f"{module} is in commands/ but defines no `command`"


def test_config_fields_are_documented() -> None:
    """Every field of a config dataclass has an attribute docstring: it is the option's --help text."""
    import importlib

    from gptcli.commands.options import field_docs

    undocumented = []
    for mod in MODULES:
        if ".commands" in mod or mod.endswith("__main__"):
            continue
        m = importlib.import_module(mod)
        for name, obj in vars(m).items():
            if (
                isinstance(obj, type)
                and dataclasses.is_dataclass(obj)
                and obj.__module__ == mod
                and name.endswith("Config")
            ):
                docs = field_docs(obj)
                undocumented += [f"{mod}.{name}.{f.name}" for f in dataclasses.fields(obj) if f.name not in docs]
    assert not undocumented, "config fields without a docstring:\n" + "\n".join(undocumented)


def _is_private(dotted: str) -> bool:
    """``torch._foo``, ``typer._click.core``: a name under torch, typer or click with a part that starts with one
    underscore (dunders such as ``torch.__version__`` are public)."""
    parts = dotted.split(".")
    return parts[0] in PRIVATE_ROOTS and any(p.startswith("_") and not p.startswith("__") for p in parts[1:])


def _private_uses(path: Path) -> list[tuple[str, int]]:
    """(name, line) for every private torch/typer/click module imported, name imported or attribute read."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(a.name, node.lineno) for a in node.names if _is_private(a.name)]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found += [
                (f"{node.module}.{a.name}", node.lineno) for a in node.names if _is_private(f"{node.module}.{a.name}")
            ]
        elif isinstance(node, ast.Attribute):
            chain, base = [node.attr], node.value
            while isinstance(base, ast.Attribute):
                chain.append(base.attr)
                base = base.value
            if isinstance(base, ast.Name) and _is_private(".".join([base.id, *reversed(chain)])):
                found.append((".".join([base.id, *reversed(chain)]), node.lineno))
    return found


def test_private_torch_and_typer_names_only_in_the_kernels_room() -> None:
    bad = []
    for mod, path in MODULES.items():
        if mod == KERNELS or mod.startswith(KERNELS + "."):
            continue
        bad += [f"{path.relative_to(PKG.parent)}:{line}: {name}" for name, line in _private_uses(path)]
    assert not bad, (
        "private torch/typer/click names outside gptcli/model/kernels/ (use the public API, or move "
        "the fast path into the kernels room):\n" + "\n".join(sorted(set(bad)))
    )


def test_the_rule_sees_private_names() -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        probe = Path(tmp) / "probe.py"
        probe.write_text(
            "import torch\nfrom typer._click import core\nimport torch._dynamo\n"
            "x = torch._softmax_backward_data\ny = torch.__version__\nz = torch.nn.functional.gelu\n"
        )
        assert sorted(name for name, _ in _private_uses(probe)) == [
            "torch._dynamo",
            "torch._softmax_backward_data",
            "typer._click.core",
        ]


def _top_level_imports(path: Path, module: str) -> set[str]:
    """The modules ``path`` imports outside any function (what importing it imports)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    nested = {
        id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) for n in ast.walk(f)
    }
    return {
        m
        for m, line in _imports(path, module)
        if any(
            isinstance(n, (ast.Import, ast.ImportFrom)) and n.lineno == line and id(n) not in nested
            for n in ast.walk(tree)
        )
    }


def test_the_model_imports_nothing_of_the_kernels_and_the_kernels_nothing_of_the_model() -> None:
    """The reference model (gptcli/model/ outside kernels/) is plain PyTorch and imports nothing from the kernels,
    which a run applies to a built model (``kernels.apply``); outside the model no module imports a kernel module at
    its top level, so ``--kernels reference`` never loads one (tests/model/test_kernels.py checks it at run time);
    the kernels import nothing of gptcli but the floor and each other (so the reference they must equal is never
    their dependency)."""
    bad = []
    for mod, path in MODULES.items():
        inside = mod == KERNELS or mod.startswith(KERNELS + ".")
        for imported, line in _imports(path, mod):
            where = f"{path.relative_to(PKG.parent)}:{line}"
            kernel = imported == KERNELS or imported.startswith(KERNELS + ".")
            if inside:
                if imported.startswith("gptcli") and imported in MODULES and not kernel and _room(imported) != "ground":
                    bad.append(f"{where}: the kernels import {imported}")
            elif kernel and _room(mod) == "model":
                bad.append(f"{where}: the model imports {imported} (apply the kernels from outside: kernels.apply)")
            elif imported.startswith(KERNELS + ".") and imported in _top_level_imports(path, mod):
                bad.append(f"{where}: imports {imported} at the top level (only inside a function, after the switch)")
    assert not bad, "\n".join(bad)
