"""The shape of the package: rooms under 300 lines, layers that import only downward, no
import circle, methods that never import each other."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "plasticlm"
MAX_LINES = 300

# Each top-level part of the package and its layer; a part imports only parts of a lower layer
# or its own (docs/architecture.md draws the same picture).
LAYERS = {
    0: {"errors", "env", "registry", "config", "runs", "outputs", "runtime", "tensor_files",
        "plotting", "tls", "cpu", "run_lock", "process_guard", "listener", "home", "nofollow",
        "config_files"},
    1: {"models", "data", "eval"},
    2: {"memory"},
    3: {"fednl", "refine", "scol"},
    4: {"sandbox", "run_report", "tensorboard_export"},
    5: {"experiments"},
    6: {"cli"},
}
# The papers' experiments and the sandbox world they run on: only they and the CLI import them.
HARNESS = {"experiments", "sandbox"}
LAYER_OF = {part: n for n, parts in LAYERS.items() for part in parts}
METHODS = {"fednl", "refine", "scol"}


def _sources() -> list[Path]:
    return sorted(SRC.rglob("*.py"))


def _module(path: Path) -> str:
    rel = path.relative_to(SRC.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _imports(path: Path) -> list[tuple[str, bool]]:
    """(imported plasticlm module, whether at module level) of every import in ``path``;
    ``from X import name`` counts name as a module when it is one."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    top = {id(node) for node in tree.body}
    for node in tree.body:   # TYPE_CHECKING blocks count as module level: a circle all the same
        if isinstance(node, ast.If):
            top |= {id(n) for n in ast.walk(node)}
    package = _module(path) if path.name == "__init__.py" else _module(path).rpartition(".")[0]
    out = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1]
                                + ([base] if base else []))
            names = [f"{base}.{a.name}" if (SRC.parent / f"{base}.{a.name}".replace(".", "/")
                                             ).with_suffix(".py").exists()
                     or (SRC.parent / f"{base}.{a.name}".replace(".", "/")).is_dir()
                     else base for a in node.names]
        out += [(n, id(node) in top) for n in names if n.split(".")[0] == "plasticlm"]
    return out


def _part(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


@pytest.mark.parametrize("path", _sources(), ids=lambda p: str(p.relative_to(SRC)))
def test_every_source_file_is_under_300_lines(path):
    lines = len(path.read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_LINES, f"{path.relative_to(SRC)} has {lines} lines; split it by concept"


def test_every_part_of_the_package_has_a_layer():
    parts = {p.stem if p.is_file() else p.name for p in SRC.iterdir()
             if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").exists()
             or (p.is_dir() and any(p.glob("*.py")))}
    assert parts - set(LAYER_OF) == set(), "name the layer of each new part in LAYERS"


def test_layers_import_only_downward_and_methods_never_each_other():
    wrong = []
    for path in _sources():
        here = _part(_module(path))
        if not here:   # the package's own __init__ sets up the float path and errors
            continue
        for target, _ in _imports(path):
            there = _part(target)
            if not there or there == here:
                continue
            if LAYER_OF.get(there, 0) >= LAYER_OF.get(here, 0) and not (
                    LAYER_OF.get(here) == 0 and LAYER_OF.get(there) == 0):
                wrong.append(f"{_module(path)} imports {target}")
            if here in METHODS and there in METHODS:
                wrong.append(f"method {here} imports method {there}")
    assert not wrong, "\n".join(wrong)


def _harness_imports() -> list[str]:
    """Imports of the experiments or the sandbox from outside them and the CLI, and of one
    method's experiments from another's."""
    wrong = []
    for path in _sources():
        module = _module(path)
        here = _part(module)
        for target, _ in _imports(path):
            if _part(target) in HARNESS and here not in HARNESS | {"cli"}:
                wrong.append(f"{module} imports {target}")
            mine, theirs = module.split("."), target.split(".")
            if (here == _part(target) == "experiments" and len(mine) > 2 and len(theirs) > 2
                    and {mine[2], theirs[2]} <= METHODS and mine[2] != theirs[2]):
                wrong.append(f"{module} imports {target}")
    return wrong


def test_nothing_in_the_library_imports_the_experiments_or_the_sandbox():
    """The mechanisms a user imports stand alone: the papers' harness and its world sit on
    top (docs/architecture.md)."""
    wrong = _harness_imports()
    assert not wrong, "\n".join(wrong)


def test_the_harness_check_sees_a_planted_import(tmp_path, monkeypatch):
    """Break it to trust it: a mechanism module that imports the sandbox."""
    pkg = tmp_path / "plasticlm"
    (pkg / "fednl").mkdir(parents=True)
    (pkg / "sandbox").mkdir()
    (pkg / "sandbox" / "tasks.py").write_text("X = 1\n")
    (pkg / "fednl" / "clients.py").write_text("from plasticlm.sandbox.tasks import X\n")
    monkeypatch.setattr(__import__(__name__), "SRC", pkg)
    assert _harness_imports() == ["plasticlm.fednl.clients imports plasticlm.sandbox.tasks"]


def test_data_imports_nothing_of_the_package_but_errors():
    wrong = [f"{_module(p)} imports {t}" for p in (SRC / "data").rglob("*.py")
             for t, _ in _imports(p) if _part(t) not in ("data", "errors")]
    assert not wrong, "\n".join(wrong)


def test_no_import_circle_between_modules():
    graph: dict[str, set[str]] = {}
    modules = {_module(p) for p in _sources()}
    for path in _sources():
        # a package's __init__ re-exporting its modules is not a circle of theirs
        if path.name == "__init__.py":
            continue
        graph[_module(path)] = {t for t, top in _imports(path)
                                if top and t in modules and not t.endswith("__init__")
                                and (SRC.parent / t.replace(".", "/")).with_suffix(".py").exists()}
    seen, stack, circles = set(), [], []

    def visit(node: str) -> None:
        if node in stack:
            circles.append(" -> ".join(stack[stack.index(node):] + [node]))
            return
        if node in seen:
            return
        seen.add(node)
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            visit(nxt)
        stack.pop()

    for module in sorted(graph):
        visit(module)
    assert not circles, "\n".join(circles)


def test_the_circle_check_sees_a_circle(tmp_path, monkeypatch):
    """Break it to trust it: a fake package whose two modules import each other."""
    pkg = tmp_path / "plasticlm" / "scol"
    pkg.mkdir(parents=True)
    (pkg / "a.py").write_text("from plasticlm.scol.b import B\n")
    (pkg / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                              "    from plasticlm.scol.a import A\n")
    monkeypatch.setattr(__import__(__name__), "SRC", tmp_path / "plasticlm")
    with pytest.raises(AssertionError, match="scol.a -> plasticlm.scol.b"):
        test_no_import_circle_between_modules()
