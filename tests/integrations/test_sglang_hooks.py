"""SGLang's own code reading the adapter: hook parity, the four missing methods, call sites."""

import importlib
import sys
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from specstrat import BUILTINS, InvalidConfig, SpecAlgorithm, SpecstratError
from specstrat.integrations._sglang_check import _placeholder_worker
from specstrat.integrations.sglang import (
    CHECKED_DRAFT_TOKENS,
    SGLangCheck,
    check_sglang,
    enum_methods,
    load_sglang,
    register,
)
from tests.integrations.sglang_standins import (
    USER_DRAFT,
    StandInWorker,
    req_to_token_pool,
    spec_config,
    spec_utils_functions,
)
from tests.typing.readme_example import MY_EAGLE

SPECULATIVE_BUILTINS = [algo for algo in BUILTINS if algo.is_speculative()]
#: What SGLang 0.5.23's CustomSpecAlgo lacks of the enum's methods (the adapter supplies them).
MISSING_FROM_CUSTOM_SPEC_ALGO = {
    "create_future_map",
    "need_topk",
    "carries_draft_hidden_states",
    "get_platform_worker_cls",
}


def prefixed(algo: SpecAlgorithm[Any]) -> Any:
    """``algo`` registered in SGLang as SPECSTRAT_<name> (built-in names are SGLang's)."""
    return register(algo, worker=StandInWorker, name=f"SPECSTRAT_{algo.name}")


@pytest.mark.parametrize("algo", [*SPECULATIVE_BUILTINS, MY_EAGLE], ids=lambda a: a.name)
def test_check_sglang_passes_every_builtin_and_the_readme_algorithm(
    algo: SpecAlgorithm[Any], sglang_registry: dict[str, Any]
) -> None:
    """Registration, method set and every hook agree with specstrat (D = 2..8, both workers)."""
    name = f"SPECSTRAT_{algo.name}" if algo in BUILTINS else None
    before = dict(sglang_registry)
    report = check_sglang(algo, name=name)
    assert report.failures() == ()
    names = [check.name for check in report.checks]
    assert names[1].startswith("registration and from_string(")
    assert names[2].startswith("method set (")
    for hook in ("supports_target_verify_for_draft", "need_topk", "create_future_map"):
        assert any(n.startswith(f"hook {hook}") for n in names)
    assert sglang_registry == before  # the temporary registration is gone


def test_check_sglang_reuses_a_registration_and_reports_failures() -> None:
    """An algorithm already registered is checked in place; a refused one is one FAIL line."""
    spec = prefixed(MY_EAGLE)
    assert check_sglang(MY_EAGLE, name="SPECSTRAT_MY_EAGLE").passed
    assert load_sglang().algorithm_enum.from_string("SPECSTRAT_MY_EAGLE") is spec
    clash = check_sglang(SPECULATIVE_BUILTINS[0])
    assert not clash.passed
    assert clash.failures()[0].line().startswith("FAIL sglang: registration\n    RegistrationError")
    user = check_sglang(USER_DRAFT)
    assert "pass to_spec_input=f" in user.failures()[0].detail
    assert check_sglang(USER_DRAFT, to_spec_input=lambda draft: draft).passed


def test_a_hook_that_disagrees_is_a_fail_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """A generated class answering differently from specstrat fails that hook's line only."""
    spec = prefixed(MY_EAGLE)
    monkeypatch.setattr(type(spec), "need_topk", lambda self: False)
    monkeypatch.setattr(type(spec), "get_platform_worker_cls", None)
    report = check_sglang(MY_EAGLE, name="SPECSTRAT_MY_EAGLE")
    failed = {check.name.split(" (")[0]: check.detail for check in report.failures()}
    assert failed["hook need_topk"] == "sglang=False, specstrat=True"
    assert failed["method set"] == "missing: get_platform_worker_cls"
    assert failed["hook get_platform_worker_cls"].startswith('sglang="raised TypeError')


def test_custom_spec_algo_lacks_four_methods_the_adapter_supplies(enum: Any) -> None:
    """SGLang's base class misses exactly the four methods; the generated class has them all."""
    modules = load_sglang()
    expected = enum_methods(modules)
    assert "from_string" not in expected
    assert "register" not in expected
    base = modules.custom_spec_algo
    assert {m for m in expected if not hasattr(base, m)} == MISSING_FROM_CUSTOM_SPEC_ALGO
    spec = prefixed(MY_EAGLE)
    assert all(callable(getattr(spec, m)) for m in expected)


@pytest.mark.parametrize("algo", SPECULATIVE_BUILTINS, ids=lambda a: a.name)
def test_the_four_methods_answer_what_sglangs_callers_expect(
    algo: SpecAlgorithm[Any], overlap_utils: Any
) -> None:
    """create_future_map -> SGLang's FutureMap for it; need_topk/carries -> bools; no platform."""
    spec = prefixed(algo)
    relay = spec.create_future_map(
        torch.device("cpu"), req_to_token_pool(rows=5), needs_cpu_seq_lens=False
    )
    assert isinstance(relay, overlap_utils.FutureMap)
    assert relay.spec_algo is spec
    assert relay.req_pool_size == 5
    assert relay.needs_cpu_seq_lens is False
    assert spec.need_topk() is algo.capabilities.need_topk
    assert spec.carries_draft_hidden_states() is algo.capabilities.carries_draft_hidden_states
    assert spec.get_platform_worker_cls() is None


@pytest.mark.parametrize("algo", [*SPECULATIVE_BUILTINS, MY_EAGLE], ids=lambda a: a.name)
def test_resolve_num_tokens_per_req_reads_the_adapter(algo: SpecAlgorithm[Any]) -> None:
    """SGLang's resolve_num_tokens_per_req (its source, as released) answers as specstrat does."""
    spec = prefixed(algo)
    config = spec_config(speculative_algorithm=spec.name, speculative_num_draft_tokens=5)
    resolve = spec_utils_functions(lambda: config).resolve_num_tokens_per_req
    for d in CHECKED_DRAFT_TOKENS:
        for draft in (False, True):
            got = resolve(
                phase="target_verify",
                spec_algorithm=spec,
                is_draft_worker=draft,
                num_draft_tokens=d,
            )
            assert got == algo.get_num_tokens_per_req_for_target_verify(d, draft)
    unset = resolve(phase="target_verify", spec_algorithm=spec, is_draft_worker=True)
    assert unset == algo.get_num_tokens_per_req_for_target_verify(5, True)


@pytest.mark.parametrize("algo", SPECULATIVE_BUILTINS, ids=lambda a: a.name)
@pytest.mark.parametrize(("page_size", "topk"), [(1, 1), (16, 1), (16, 4)])
def test_get_alloc_len_per_decode_reads_the_adapter(
    algo: SpecAlgorithm[Any], page_size: int, topk: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SGLang's KV sizing gives the adapter what it gives the same-named built-in."""
    sizing = importlib.import_module("sglang.srt.mem_cache.allocation_sizing")
    prefixed(algo)
    config = spec_config(speculative_num_steps=3, speculative_eagle_topk=topk)
    monkeypatch.setattr(sizing, "get_spec", lambda: config)
    monkeypatch.setattr(sizing, "max_speculative_num_draft_tokens", lambda: 8)
    monkeypatch.setattr(sizing, "get_schedule", lambda: SimpleNamespace(page_size=page_size))
    monkeypatch.setattr(sizing, "get_parallel", lambda: SimpleNamespace(attn_dcp_size=1))
    answers = {}
    for name in (algo.name, f"SPECSTRAT_{algo.name}"):
        config.speculative_algorithm = name
        answers[name] = sizing.get_alloc_len_per_decode()
    assert answers[algo.name] == answers[f"SPECSTRAT_{algo.name}"]


@pytest.mark.parametrize("algo", SPECULATIVE_BUILTINS, ids=lambda a: a.name)
def test_future_map_stash_and_resolve_through_sglang(
    algo: SpecAlgorithm[Any], overlap_utils: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SGLang's FutureMap, made by the adapter, relays what the algorithm's capabilities carry.

    The relay gather is SGLang's Triton kernel, run by the interpreter (TRITON_INTERPRET=1 is
    set by tests/conftest.py before Triton is imported).
    """
    spec = prefixed(algo)
    config = spec_config(speculative_algorithm=spec.name)
    monkeypatch.setitem(
        sys.modules, "sglang.srt.speculative.spec_utils", spec_utils_functions(lambda: config)
    )
    relay = spec.create_future_map(torch.device("cpu"), req_to_token_pool(rows=6))
    slots = torch.tensor([2, 5], dtype=torch.int64)
    payload = overlap_utils.RelayPayload(
        bonus_tokens=torch.tensor([11, 12]),
        topk_p=torch.tensor([[0.7], [0.4]]),
        topk_index=torch.tensor([[3], [4]]),
        hidden_states=torch.tensor([[1.0, 2.0], [3.0, 4.0]])
        if spec.carries_draft_hidden_states()
        else None,
    )
    relay.publish(slots, torch.tensor([9, 17]))
    relay.stash(slots, payload)
    draft = SimpleNamespace(future_indices=slots, future_dsa_topk_indices_available=False)
    batch = SimpleNamespace(
        prefill_input_ids_cpu=None,
        input_ids=torch.tensor([0, 0]),
        spec_algorithm=spec,
        enable_overlap=True,
        spec_info=draft,
        req_pool_indices=slots,
        req_pool_indices_cpu=slots,
    )
    overlap_utils.resolve_forward_inputs(batch, relay)
    relay.resolve_seq_lens_cpu(batch)
    assert batch.seq_lens.tolist() == [9, 17]
    assert draft.bonus_tokens.tolist() == [11, 12]
    assert relay.need_topk is algo.capabilities.need_topk
    if algo.capabilities.need_topk:
        assert draft.topk_p.tolist() == [[pytest.approx(0.7)], [pytest.approx(0.4)]]
        assert draft.topk_index.tolist() == [[3], [4]]
    else:
        assert not hasattr(draft, "topk_p")
    if algo.capabilities.carries_draft_hidden_states:
        assert draft.hidden_states.tolist() == [[1.0, 2.0], [3.0, 4.0]]
    else:
        assert relay.hidden_states_buf is None


def test_report_lines_are_one_per_check() -> None:
    """A passing check is one line; a failing one adds its reason, indented."""
    assert SGLangCheck("hook need_topk", True).line() == "PASS sglang: hook need_topk"
    failed = SGLangCheck("hook need_topk", False, "sglang=False, specstrat=True")
    assert failed.line() == "FAIL sglang: hook need_topk\n    sglang=False, specstrat=True"


def test_check_sglang_refuses_what_is_not_an_algorithm() -> None:
    """check_sglang takes a SpecAlgorithm; anything else is an InvalidConfig naming it."""
    with pytest.raises(InvalidConfig, match=r"algo='MY_EAGLE' is a str"):
        check_sglang("MY_EAGLE")  # type: ignore[arg-type]


def test_the_checks_placeholder_worker_is_never_a_worker() -> None:
    """The worker factory of a check-only registration says how to register for real."""
    with pytest.raises(SpecstratError, match=r"registered this algorithm only to check it"):
        _placeholder_worker(None)
