"""The package's shape: no import cycle, layers that import only downwards, no private module
imported from outside its package, a product that does not import the test kit, unique module
names, small modules, explicit dataclasses, one ForwardBatch constructor, and a runtime that
picks nothing from capability combinations."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "specstrat"
MODULES = sorted(ROOT.rglob("*.py"))


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


NAMES = {module_name(p): p for p in MODULES}
PACKAGES = {module_name(p) for p in MODULES if p.name == "__init__.py"}


def import_targets(path: Path) -> list[tuple[int, str]]:
    """Every dotted name ``path`` imports, with its line, at any depth (function bodies and
    TYPE_CHECKING blocks included): ``from a.b import c`` gives ``a.b`` and ``a.b.c``; relative
    imports are resolved."""
    package = (
        module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    )
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, a.name) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            found.append((node.lineno, base))
            found.extend((node.lineno, f"{base}.{a.name}") for a in node.names)
    return found


def imports_of(path: Path) -> set[str]:
    """specstrat modules ``path`` imports, at any depth (function bodies included)."""
    found: set[str] = set()
    for _, target in import_targets(path):
        while target and target not in NAMES:
            target = target.rpartition(".")[0]
        if target.startswith("specstrat") and target != module_name(path):
            found.add(target)
    return found


def _is_private(part: str) -> bool:
    return part.startswith("_") and not (part.startswith("__") and part.endswith("__"))


def private_owner(target: str) -> str | None:
    """The package a dotted name is private to, or None when no part of it is private: ``a.b``
    for a private module ``a.b._x`` (and anything in it) and for a private name ``a.b.c._y`` of
    a public module ``a.b.c``."""
    parts = target.split(".")
    for i, part in enumerate(parts):
        if _is_private(part):
            owner = ".".join(parts[:i])
            return owner if owner in PACKAGES else owner.rpartition(".")[0]
    return None


def test_no_private_module_is_imported_from_outside_its_package() -> None:
    """A private module ``a.b._x`` (or a name in it, or a private name of a public module of
    ``a.b``) is imported only from modules inside package ``a.b``: every other package reaches
    it through the public name ``a.b`` exports."""
    offenders = [
        f"{module_name(path)}:{line} imports {target} (private to {owner})"
        for path in MODULES
        for line, target in import_targets(path)
        if target.startswith("specstrat")
        and (owner := private_owner(target)) is not None
        and module_name(path) != owner
        and not module_name(path).startswith(owner + ".")
    ]
    assert offenders == []


#: What the runtime and the kernels sit below: never imported by them, even inside a function.
LOWER = ("specstrat.runtime", "specstrat.kernels")
HIGHER = (
    "specstrat.demo",
    "specstrat.hf",
    "specstrat.bench",
    "specstrat.cli",
    "specstrat._cli_check",
    "specstrat.integrations",
)


def _inside(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


@pytest.mark.parametrize("lower", LOWER)
def test_lower_layers_never_import_higher_ones(lower: str) -> None:
    """No runtime or kernel module imports the demo, the Hugging Face adapter, the bench, the
    CLI or the engine integrations, even inside a function: those hand the runtime loaded
    models and algorithms, so they sit above it, not in a cycle with it."""
    offenders = sorted(
        f"{name} imports {target}"
        for name, path in NAMES.items()
        if _inside(name, lower)
        for target in imports_of(path)
        if any(_inside(target, higher) for higher in HIGHER)
    )
    assert offenders == []


def test_only_the_check_command_imports_the_test_kit() -> None:
    """No product module imports specstrat.testing (even inside a function) except the
    ``check`` command: what the product needs from the kit lives in product modules, which the
    kit re-exports."""
    offenders = sorted(
        f"{name} imports {target}"
        for name, path in NAMES.items()
        if not _inside(name, "specstrat.testing") and name != "specstrat._cli_check"
        for target in imports_of(path)
        if _inside(target, "specstrat.testing")
    )
    assert offenders == []


def test_module_names_do_not_repeat_across_packages() -> None:
    """Every module's file name (``_x.py`` and ``x.py`` counting as one; ``__init__.py`` and the
    deprecated 0.3.0 shims aside) appears once in the package, so a name says which module it
    is without its package."""
    seen: dict[str, list[str]] = {}
    for path in MODULES:
        if path.name == "__init__.py":
            continue
        seen.setdefault(path.stem.lstrip("_"), []).append(str(path.relative_to(ROOT)))
    assert {k: v for k, v in seen.items() if len(v) > 1} == {}


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
