"""The floor plan holds: no import circles, every module placed in a layer, and features entered by their doors.

import-linter (pyproject.toml) checks the layers it is told about; these tests make sure it is told about every
module, so a new one cannot slip past the contracts by being left out of them.
"""

from __future__ import annotations

import ast
import importlib
import tomllib
from pathlib import Path

import grimp
import pytest

REPO = Path(__file__).resolve().parents[1]
APP = REPO / "app"
# The Python client is shipped on its own (as `preflab`) and has a contract of its own.
OUTSIDE_THE_PLAN = ("app.client",)


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph("app", "training")


def _contracts() -> list[dict]:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]


def _layers(name_starts: str) -> list[list[str]]:
    """The modules of each layer of the contract whose name starts so, top layer first."""
    contract = next(c for c in _contracts() if c["name"].startswith(name_starts))
    return [[m.strip() for m in layer.replace("|", ":").split(":")] for layer in contract["layers"]]


def _layered(name_starts: str) -> list[str]:
    return [m for layer in _layers(name_starts) for m in layer]


def _in_plan(module: str) -> bool:
    return not any(module == o or module.startswith(o + ".") for o in OUTSIDE_THE_PLAN)


def _cycles(graph: grimp.ImportGraph, modules: list[str]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in modules:
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.find_modules_directly_imported_by(child)))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_circles_in_app_or_training(graph: grimp.ImportGraph) -> None:
    # Imports inside functions and under TYPE_CHECKING count too: a circle hidden in a function is still a circle.
    assert _cycles(graph, sorted(graph.modules)) == []


def test_the_cycle_finder_finds_a_planted_circle() -> None:
    planted = grimp.ImportGraph()
    for a, b in (("p.a", "p.b"), ("p.b", "p.c"), ("p.c", "p.a"), ("p.c", "p.d")):
        planted.add_import(importer=a, imported=b)
    assert _cycles(planted, sorted(planted.modules)) == [["p.a", "p.b", "p.c"]]


def test_every_module_of_app_is_placed_in_the_layers(graph: grimp.ImportGraph) -> None:
    listed = _layered("layers: main, cli and worker")
    packages = {m for m in graph.modules if (APP.parent / m.replace(".", "/") / "__init__.py").exists()}
    unplaced = sorted(
        m for m in graph.modules
        if m.startswith("app.") and _in_plan(m) and m not in packages
        and not any(m == entry or m.startswith(entry + ".") for entry in listed))
    assert unplaced == [], f"add these to the layers contract in pyproject.toml: {unplaced}"


def test_every_service_module_of_a_feature_is_ordered_among_the_features(graph: grimp.ImportGraph) -> None:
    entry_layer = set(_layers("layers: main, cli and worker")[1])
    services = _layered("features' services, one way")
    for module in sorted(graph.modules):
        parts = module.split(".")
        if len(parts) != 3 or parts[0] != "app" or parts[1] in ("web", "platform", "demo", "client") \
                or module in entry_layer:
            continue
        assert any(module == s or module.startswith(s + ".") for s in services), \
            f"{module} is a service: place it in the features' one-way contract in pyproject.toml"


def test_app_root_holds_only_the_shell() -> None:
    modules = sorted(p.stem for p in APP.glob("*.py"))
    assert modules == ["__init__", "asgi", "cli", "main", "models", "schemas", "worker"]


def _features() -> list[str]:
    return sorted(p.parent.name for p in APP.glob("*/__init__.py") if p.parent.name != "client")


@pytest.mark.parametrize("feature", _features())
def test_each_package_is_a_room_with_a_door(feature: str) -> None:
    init = APP / feature / "__init__.py"
    doc = ast.get_docstring(ast.parse(init.read_text()))
    assert doc and doc.splitlines()[0].endswith("."), f"app/{feature}/__init__.py: a one-line summary first"
    package = importlib.import_module(f"app.{feature}")
    public = getattr(package, "__all__", None)
    assert public, f"app/{feature}/__init__.py names what other packages may use in __all__"
    for name in public:
        assert (APP / feature / f"{name}.py").exists() or hasattr(package, name), f"app.{feature}.{name}"


def test_other_packages_enter_a_feature_only_by_what_its_door_names(graph: grimp.ImportGraph) -> None:
    doors = {f: set(importlib.import_module(f"app.{f}").__all__) for f in _features()}
    trespass = []
    for importer in sorted(graph.modules):
        for imported in sorted(graph.find_modules_directly_imported_by(importer)):
            parts = imported.split(".")
            if len(parts) < 3 or parts[0] != "app" or parts[1] not in doors:
                continue
            if importer == f"app.{parts[1]}" or importer.startswith(f"app.{parts[1]}."):
                continue  # inside the room
            if parts[2] not in doors[parts[1]]:
                trespass.append(f"{importer} -> {imported}")
    assert trespass == [], "use the feature's door (its __init__'s __all__), or add the module to it: " + \
        "; ".join(trespass)
