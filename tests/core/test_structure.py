"""The package's shape: no import cycle, small modules, explicit dataclasses, one ForwardBatch
constructor, and a runtime that picks nothing from capability combinations."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "specstrat"
MODULES = sorted(ROOT.rglob("*.py"))


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


NAMES = {module_name(p): p for p in MODULES}


def imports_of(path: Path) -> set[str]:
    """specstrat modules ``path`` imports, at any depth (function bodies included)."""
    package = (
        module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    )
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            targets = [f"{base}.{a.name}" for a in node.names] + [base]
        for target in targets:
            while target and target not in NAMES:
                target = target.rpartition(".")[0]
            if target.startswith("specstrat") and target != module_name(path):
                found.add(target)
    return found


def test_no_import_cycle() -> None:
    """No specstrat module reaches itself through its imports (absolute or relative, at any
    depth), so no type degrades to Any through a cycle."""
    graph = {name: imports_of(path) for name, path in NAMES.items()}
    # A package's __init__ importing its own submodules is how packages re-export, not a cycle.
    for name in graph:
        graph[name] = {t for t in graph[name] if not t.startswith(name + ".")}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(name: str) -> None:
        state[name] = 1
        stack.append(name)
        for target in sorted(graph[name]):
            if state.get(target) == 1:
                cycle = [*stack[stack.index(target) :], target]
                pytest.fail(f"import cycle: {' -> '.join(cycle)}")
            if target not in state:
                visit(target)
        stack.pop()
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name)


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_modules_stay_under_400_lines(path: Path) -> None:
    """Every module is at most 400 lines (a longer one holds two things)."""
    assert len(path.read_text().splitlines()) <= 400


def test_every_dataclass_spells_out_frozen_and_slots() -> None:
    """Each @dataclass in specstrat/ says frozen= and slots= explicitly."""
    missing = []
    for path in MODULES:
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ClassDef):
                continue
            for deco in node.decorator_list:
                name = deco.func if isinstance(deco, ast.Call) else deco
                if getattr(name, "id", None) != "dataclass":
                    continue
                given = {k.arg for k in deco.keywords} if isinstance(deco, ast.Call) else set()
                if not {"frozen", "slots"} <= given:
                    missing.append(f"{path.relative_to(ROOT)}:{node.name}")
    assert missing == []


def test_forward_batch_is_built_in_one_place() -> None:
    """ForwardBatch(...) is constructed once, in the worker's execute()."""
    calls = [
        str(path.relative_to(ROOT))
        for path in MODULES
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "ForwardBatch"
    ]
    assert calls == ["runtime/_worker.py"]


def test_the_runtime_reads_no_drafting_capability() -> None:
    """The runtime never reads the drafting capabilities (hidden states, draft KV, top-k):
    drafters are strategies, capabilities are facts checked at construction."""
    for path in (ROOT / "runtime").rglob("*.py"):
        text = path.read_text()
        for flag in ("carries_draft_hidden_states", "has_draft_kv", "need_topk"):
            assert flag not in text, f"{path.relative_to(ROOT)} reads {flag}"


def test_runtime_never_imports_the_hf_adapter() -> None:
    """No runtime module imports specstrat.hf, even inside a function: the demo and the CLI hand
    the runtime loaded models, so the adapter's package sits above the runtime, not in a cycle."""
    offenders = {
        name: sorted(
            t for t in imports_of(path) if t == "specstrat.hf" or t.startswith("specstrat.hf.")
        )
        for name, path in NAMES.items()
        if name.startswith("specstrat.runtime")
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def _node(module: str) -> str:
    """A module's node in the package graph: its package below specstrat, or the root module."""
    return ".".join(module.split(".")[:2])


def test_no_cycle_among_packages_and_root_modules() -> None:
    """Taking each package (runtime, testing, strategies, ...) and each root module as one node,
    with every import as an edge (function-level and TYPE_CHECKING ones included; the top-level
    __init__'s re-exports are not edges), the graph has no cycle."""
    graph: dict[str, set[str]] = {}
    for name, path in NAMES.items():
        if name == "specstrat":
            continue  # the top-level re-exports are not edges
        edges = graph.setdefault(_node(name), set())
        edges.update(
            _node(t) for t in imports_of(path) if _node(t) not in {_node(name), "specstrat"}
        )
    state: dict[str, int] = {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for target in sorted(graph.get(node, ())):
            if state.get(target) == 1:
                cycle = [*stack[stack.index(target) :], target]
                pytest.fail(f"package cycle: {' -> '.join(cycle)}")
            if target not in state:
                visit(target, [*stack, target])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])


CORE = ("algorithm", "batch", "contracts", "drafting", "errors", "models", "protocols", "relay")


@pytest.mark.parametrize("core", CORE)
def test_the_core_types_do_not_import_the_strategies(core: str) -> None:
    """The algorithm type and the data types hooks exchange import no strategy: the strategies
    are built on them, not the other way round."""
    name = f"specstrat.{core}"
    assert {t for t in imports_of(NAMES[name]) if t.startswith("specstrat.strategies")} == set()
