"""The package's shape, checked: rooms import downwards only, no cycles, UI stays in the command layer.

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
    "model": 1, "tokenizers": 1,
    "checkpoint": 2, "data": 2, "tasks": 2,
    "train": 3, "eval": 3, "interop": 3,
    "pipelines": 4,
    "commands": 5, "cli": 5, "__main__": 5,
}
GROUND = {"errors", "config", "runtime", "fsutil", "progress", "outputs", "locks", "__init__"}
UI_PACKAGES = ("typer", "rich", "click")
MAX_FUNCTION_LINES = 80


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
    assert not unknown, f"modules outside the rooms of RANKS: {unknown} (add the room, with its rank, and to docs/architecture.md)"


def test_rooms_import_downwards_only() -> None:
    bad = []
    for mod, path in MODULES.items():
        rank = RANKS[_room(mod)]
        for imported, line in _imports(path, mod):
            if imported.startswith("gptcli") and imported in MODULES and RANKS[_room(imported)] > rank:
                bad.append(f"{path.relative_to(PKG.parent)}:{line}: {_room(mod)} imports {imported} ({_room(imported)})")
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
                cycles.append(" -> ".join(stack[stack.index(n):] + [n]))
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
    for mod, path in MODULES.items():
        for fn in _functions(path):
            n = fn.end_lineno - fn.lineno + 1
            if n > MAX_FUNCTION_LINES:
                long.append(f"{path.relative_to(PKG.parent)}:{fn.lineno}: {fn.name} has {n} lines")
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines (split them into named stages):\n" + "\n".join(long)


def test_tests_mirror_the_package() -> None:
    tests = Path(__file__).resolve().parent
    rooms = {p.name for p in PKG.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
    missing = sorted(r for r in rooms if not (tests / r).is_dir())
    assert not missing, f"tests/ has no folder for the package's rooms {missing}"


def test_public_names_still_import() -> None:
    import gptcli

    for name in ("GPT", "ModelConfig", "load_checkpoint", "open_corpus", "get_task", "Tokenizer", "save_checkpoint"):
        assert getattr(gptcli, name) is not None


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m.startswith("gptcli.commands.") and m not in (
    "gptcli.commands.options", "gptcli.commands.render", "gptcli.commands.defaults")))
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
            if (isinstance(obj, type) and dataclasses.is_dataclass(obj) and obj.__module__ == mod
                    and name.endswith("Config")):
                docs = field_docs(obj)
                undocumented += [f"{mod}.{name}.{f.name}" for f in dataclasses.fields(obj) if f.name not in docs]
    assert not undocumented, "config fields without a docstring:\n" + "\n".join(undocumented)
