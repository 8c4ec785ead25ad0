"""docs/glossary.md's retired uses stay retired in the public API: "width" is only D, T is never
a "verify width", a bonus token is never called last or first, a KV index is never a slot."""

import ast
import importlib
import inspect
import re
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass, fields, is_dataclass
from typing import Any

import pytest

from tests.core.test_public_api import PUBLIC_MODULES


@dataclass(frozen=True)
class Name:
    """One public name: ``owner`` (a dotted path) holds ``name``, a parameter or an attribute."""

    owner: str
    name: str


def _parameters(owner: str, func: Any) -> Iterator[Name]:
    """The parameters of ``func`` (``self`` and ``cls`` left out)."""
    try:
        signature = inspect.signature(func)
    except (TypeError, ValueError):  # a builtin with no signature
        return
    for param in signature.parameters:
        if param not in ("self", "cls"):
            yield Name(owner, param)


def _assigned(cls: type) -> Iterator[str]:
    """The attributes a class's own methods assign on ``self``, from its source."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError):
        return
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else []
        if isinstance(node, ast.AnnAssign):
            targets = [node.target]
        for target in targets:
            for t in target.elts if isinstance(target, ast.Tuple) else [target]:
                if (
                    isinstance(t, ast.Attribute)
                    and isinstance(t.value, ast.Name)
                    and t.value.id == "self"
                ):
                    yield t.attr


def _class_names(path: str, cls: type) -> Iterator[Name]:
    """A class's fields, annotated and assigned attributes, methods and their parameters."""
    if is_dataclass(cls):
        yield from (Name(path, f.name) for f in fields(cls))
    yield from (Name(path, a) for a in vars(cls).get("__annotations__", {}))
    yield from (Name(path, a) for a in _assigned(cls))
    yield from _parameters(path, cls)
    for attr, member in vars(cls).items():
        if attr.startswith("_") and attr != "__init__":
            continue
        func = member.fget if isinstance(member, property) else member
        func = getattr(func, "__func__", func)  # classmethod, staticmethod
        if callable(func):
            if not attr.startswith("_"):
                yield Name(path, attr)
            yield from _parameters(f"{path}.{attr}", func)


def _owned(obj: object) -> bool:
    """Whether ``obj`` is specstrat's own (not a re-exported torch or stdlib object)."""
    return str(getattr(obj, "__module__", "")).startswith("specstrat")


def _public() -> Iterator[tuple[str, object]]:
    """Every public module and each specstrat object its ``__all__`` lists, by dotted path."""
    for module_name in PUBLIC_MODULES:
        module = importlib.import_module(module_name)
        yield module_name, module
        for name in module.__all__:
            obj = getattr(module, name)
            if (inspect.isclass(obj) or inspect.isfunction(obj)) and _owned(obj):
                yield f"{module_name}.{name}", obj


PUBLIC = list(_public())


def _names() -> list[Name]:
    """Every parameter and attribute name of the public API."""
    found: list[Name] = []
    for path, obj in PUBLIC:
        if inspect.isclass(obj):
            found.extend(_class_names(path, obj))
        elif inspect.isfunction(obj):
            found.extend(_parameters(path, obj))
    return found


def _docstrings() -> list[tuple[str, str]]:
    """Every docstring of the public API: modules, functions, classes and their members."""
    docs: list[tuple[str, str]] = []
    for path, obj in PUBLIC:
        docs.append((path, inspect.getdoc(obj) or ""))
        if inspect.isclass(obj):
            for attr, member in vars(obj).items():
                func = member.fget if isinstance(member, property) else member
                func = getattr(func, "__func__", func)
                if callable(func) and func.__doc__:
                    docs.append((f"{path}.{attr}", inspect.getdoc(func) or ""))
    return docs


NAMES = _names()
DOCSTRINGS = _docstrings()

#: Names with "width" that are D (the speculation policy's per-step choice), wherever they
#: appear: its candidates, its choice, the histogram and history of the chosen D.
D_NAMES = frozenset({"candidate_widths", "choose_width", "width_histogram", "recent_widths"})

#: Owners whose plain ``width``/``widths`` is D: speculation policies and choosers, the run's
#: per-step D (``RunStats.widths``, a bench row's), the D a reservation covers.
D_OWNERS = re.compile(
    r"\.(\w*SpeculationPolicy|\w*Chooser|RunStats|KVReservation|BenchRow)(\.__init__)?$"
    r"|\.SpeculationObservation\.cost$"
)

#: Widths that are neither D nor T: a tensor's column count (``HFCausalLM``'s LM head).
TENSOR_WIDTHS = frozenset({"head_width"})

#: SGLang's seed hook keeps its spelling of the bonus tokens (docs/glossary.md).
SGLANG_LAST_TOKENS = re.compile(r"\.build_disagg_draft_input$")

RETIRED_BONUS = frozenset({"last", "last_tokens", "first_tokens"})

#: ``last`` that is a time, not a token: the bench's per-request last-token timestamps.
LAST_TOKEN_TIMES = re.compile(
    r"^specstrat\.bench\.(figures\.request_latencies|hf_baseline\.GenerateRecord|rows\.Record)"
)


def _is_d(use: Name) -> bool:
    """Whether a name with "width" in it is one of the allowed D names."""
    return use.name in D_NAMES or (
        use.name in ("width", "widths") and D_OWNERS.search(use.owner) is not None
    )


def test_the_walk_reaches_the_public_api() -> None:
    """The walk sees the public API's parameters, fields, attributes and docstrings."""
    assert Name("specstrat.runtime.RunStats.count_verify", "forward_tokens") in NAMES
    assert Name("specstrat.runtime.RunStats", "widths") in NAMES
    assert Name("specstrat.hf.adapter.HFCausalLM", "head_width") in NAMES
    assert any(u.name == "last_tokens" and SGLANG_LAST_TOKENS.search(u.owner) for u in NAMES)
    assert any(path == "specstrat.kernels.verify_metadata" for path, _ in DOCSTRINGS)


def test_width_names_only_d() -> None:
    """A public name with "width" in it is the speculation policy's D, never T or a count."""
    # A memory bandwidth (the roofline's memory_bandwidth_gbs) is no width.
    widths = [u for u in NAMES if "width" in u.name.lower().replace("bandwidth", "")]
    assert [u for u in widths if not _is_d(u) and u.name not in TENSOR_WIDTHS] == []


def test_no_docstring_calls_t_a_verify_width() -> None:
    """No public docstring says "verify width": T is the tokens per request verified."""
    found = [path for path, doc in DOCSTRINGS if re.search(r"verify\s+width", doc, re.I)]
    assert found == []


def test_bonus_tokens_are_not_called_last_or_first() -> None:
    """No public name is last, last_tokens or first_tokens, bar SGLang's disagg builder hook."""
    retired = [
        u
        for u in NAMES
        if u.name in RETIRED_BONUS
        and not (u.name == "last_tokens" and SGLANG_LAST_TOKENS.search(u.owner))
        and not (u.name == "last" and LAST_TOKEN_TIMES.match(u.owner))
    ]
    assert retired == []


@pytest.mark.parametrize("phrase", ["token slot", "KV slot"])
def test_kv_indices_are_not_slots(phrase: str) -> None:
    """No public docstring calls a KV index a slot: a slot is a row of the request pool."""
    pattern = re.compile(phrase.replace(" ", r"\s+") + "s?", re.I)
    assert [path for path, doc in DOCSTRINGS if pattern.search(doc)] == []
