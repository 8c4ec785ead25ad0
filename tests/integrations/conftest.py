"""SGLang integration tests: skipped without SGLang, never skipped under `make test-sglang`.

`make test-sglang` runs them in .venv-sglang (the real SGLang 0.5.23) with
SPECSTRAT_REQUIRE_SGLANG=1, which turns every skip here into a failure: a test that cannot
run there is broken, not passed. Each test leaves SGLang's registry as it found it.
"""

import importlib
import os
import warnings
from collections.abc import Generator, Iterator
from typing import Any

import pytest

from tests.integrations.sglang_standins import HAVE_SGLANG

REQUIRE_SGLANG = os.environ.get("SPECSTRAT_REQUIRE_SGLANG") == "1"
SKIP_REASON = "sglang not installed (`make test-sglang` runs these in .venv-sglang)"
#: Every SGLang module the tests and the adapter import in the light venv.
SGLANG_MODULES = (
    "sglang.srt.speculative.spec_info",
    "sglang.srt.speculative.spec_registry",
    "sglang.srt.managers.overlap_utils",
    "sglang.srt.mem_cache.allocation_sizing",
    "sglang.srt.runtime_context",
    "sglang.srt.plugins",
)

if HAVE_SGLANG:
    # Importing SGLang on a CPU torch warns (torch.jit deprecations in modules it pulls in);
    # the suite turns warnings into errors, so SGLang is imported once here, quietly, and the
    # tests' own code still runs with warnings as errors.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _name in SGLANG_MODULES:
            importlib.import_module(_name)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, Any, None]:
    """Under SPECSTRAT_REQUIRE_SGLANG=1 a skipped test is reported as failed."""
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    if REQUIRE_SGLANG and report.skipped:
        report.outcome = "failed"
        report.longrepr = f"skipped under SPECSTRAT_REQUIRE_SGLANG=1: {report.longrepr}"


@pytest.fixture(autouse=True)
def sglang_registry() -> Iterator[dict[str, Any]]:
    """SGLang's plugin registry, restored after the test (registration mutates it globally)."""
    if not HAVE_SGLANG:
        pytest.skip(SKIP_REASON)
    registry: dict[str, Any] = importlib.import_module(
        "sglang.srt.speculative.spec_registry"
    )._REGISTRY
    saved = dict(registry)
    yield registry
    registry.clear()
    registry.update(saved)


@pytest.fixture
def enum() -> Any:
    """SGLang's SpeculativeAlgorithm enum."""
    return importlib.import_module("sglang.srt.speculative.spec_info").SpeculativeAlgorithm


@pytest.fixture
def overlap_utils() -> Any:
    """SGLang's managers.overlap_utils (FutureMap, RelayPayload, resolve_forward_inputs)."""
    return importlib.import_module("sglang.srt.managers.overlap_utils")
