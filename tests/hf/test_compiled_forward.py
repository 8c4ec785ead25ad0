"""The compiled forward (``HFCausalLM.compile``): the engine's greedy outputs stay transformers'
with its graphs serving the forwards of the compiled counts, other forwards run eager, and bad
counts, a model without the fast forward, a failed or disagreeing compile and the CLI's misuse
are refused by name, leaving the model as it was."""

import argparse
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch._dynamo.utils import counters

import specstrat
from specstrat import InvalidConfig, ModelLoadError, ModelSet
from specstrat._compile_flag import compile_target, int_list
from specstrat.bench.run import BenchConfig, run_bench
from specstrat.hf import HFCausalLM, HFModels, compare, generate_reference
from specstrat.hf import compiled_forward as cf
from specstrat.hf.attention_probe import Probe
from specstrat.hf.matmul_padding import MatmulPlan, run_packed
from specstrat.runtime import Engine, EngineConfig, Request
from specstrat.runtime._attention import PagedAttention
from tests.hf import tiny


@pytest.fixture(scope="module")
def compiled() -> HFCausalLM:
    """A 2-layer tiny llama compiled for forwards of 1 and 4 tokens."""
    lm = HFCausalLM(tiny.model("llama", num_hidden_layers=2), vocab_size=tiny.VOCAB, name="c")
    lm.compile([4, 1, 4])
    return lm


#: What stands for graphs compiled before in the refusal tests (they refuse before compiling).
PREVIOUS: Any = object()


@pytest.fixture
def plain() -> HFCausalLM:
    """A 1-layer tiny llama whose ``compiled`` holds :data:`PREVIOUS`."""
    lm = HFCausalLM(tiny.model("llama", num_hidden_layers=1), vocab_size=tiny.VOCAB)
    lm.compiled = PREVIOUS
    return lm


def _counting(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Token counts of every forward the compiled graphs serve, from now on."""
    served: list[int] = []
    call = cf.CompiledForward.__call__

    def spy(self: cf.CompiledForward, tokens: torch.Tensor, *args: Any) -> Any:
        served.append(int(tokens.shape[0]))
        return call(self, tokens, *args)

    monkeypatch.setattr(cf.CompiledForward, "__call__", spy)
    return served


@pytest.mark.slow  # compiles: seconds each
@pytest.mark.parametrize("algo", ["NONE", "NGRAM"])
def test_the_engine_stays_lossless_with_the_graphs_serving_decodes(
    algo: str, compiled: HFCausalLM, ids: tuple[int, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Target-only and NGRAM on the compiled model give transformers' greedy generate (ties
    certified), and the graphs serve forwards of the compiled counts, prefill running eager."""
    assert compiled.compiled is not None
    assert compiled.compiled.counts == (1, 4)
    served = _counting(monkeypatch)
    requests = [Request("a", ids[:20], 12), Request("b", ids[:9], 8)]
    config = EngineConfig(context_len=64, num_draft_tokens=4)
    outputs = Engine(algo, ModelSet(target=compiled), config).run(requests)
    check = compare(compiled, requests, outputs, generate_reference(compiled, requests))
    assert check.lossless, check.line()
    assert served
    assert set(served) <= {1, 4}


@pytest.mark.slow  # compiles: seconds each
def test_a_graph_serves_only_its_counts_rows_layers_and_threads(compiled: HFCausalLM) -> None:
    """A forward of another token count, of some rows' logits, of other layers, or on another
    thread count than the compile's runs eager."""
    graph, fast = compiled.compiled, compiled.fast_forward
    assert graph is not None
    assert fast is not None
    one, two = torch.zeros(1, dtype=torch.long), torch.zeros(2, dtype=torch.long)
    assert graph.serves(fast, one, (), None)
    assert not graph.serves(fast, two, (), None)
    assert not graph.serves(fast, one, (), torch.tensor([0]))
    assert not graph.serves(fast, one, (0,), None)
    threads = torch.get_num_threads()
    torch.set_num_threads(threads + 1)
    try:
        assert not graph.serves(fast, one, (), None)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.slow  # compiles: seconds each
def test_a_model_changed_after_compiling_drops_its_graphs(ids: tuple[int, ...]) -> None:
    """Weights cast after compiling are proven anew and run eager: the graphs, which hold the
    old weights, are dropped and the outputs are the new model's."""
    lm = HFCausalLM(tiny.model("llama", num_hidden_layers=1), vocab_size=tiny.VOCAB)
    lm.compile([1])
    lm.model.to(torch.float64)
    tokens, positions = torch.tensor(ids[:1]), torch.tensor([0])
    with torch.inference_mode():
        logits, _ = lm(tokens, positions, Probe())
        with lm.reference() as model:
            want = model(tokens[None], position_ids=positions[None]).logits[0]
    assert lm.compiled is None
    assert logits.dtype == torch.float64
    torch.testing.assert_close(logits, want[:, : tiny.VOCAB])


@pytest.mark.parametrize(
    ("counts", "match"),
    [
        ([0], r"token_counts=\[0\]: token counts to compile must be ints from 1 to 512"),
        ([], r"token_counts=\[\]: token counts to compile must be ints from 1 to 512"),
        ([1.5], r"token_counts=\[1.5\]: token counts to compile must be ints from 1 to 512"),
        ([2**70], r"token_counts=\[1180591620717411303424\]: .* ints from 1 to 512"),
        ([513], r"token_counts=\[513\]: token counts to compile must be ints from 1 to 512"),
        (list(range(1, 10)), r"9 token counts; at most 8 compile"),
        (4, r"token_counts=4: pass the token counts to compile as a list of ints"),
        ("14", r"token_counts='14': pass the token counts to compile as a list of ints"),
    ],
)
def test_bad_counts_are_refused_and_the_graphs_kept(
    counts: list[Any], match: str, plain: HFCausalLM
) -> None:
    """Counts that are not ints from 1 to the model's positions, none, more than 8, or not a
    collection are refused naming them, before any compiling; the graphs compiled before stay."""
    graphs = dict(counters["stats"]).get("unique_graphs", 0)
    with pytest.raises(InvalidConfig, match=match):
        plain.compile(counts)
    assert plain.compiled is PREVIOUS
    assert dict(counters["stats"]).get("unique_graphs", 0) == graphs


def test_a_model_on_transformers_forward_is_refused() -> None:
    """A model without the fast forward (Qwen2, or fast=False) cannot compile, saying so."""
    for lm in (
        HFCausalLM(tiny.model("qwen2"), vocab_size=tiny.VOCAB, name="q"),
        HFCausalLM(tiny.model("llama"), vocab_size=tiny.VOCAB, name="q", fast=False),
    ):
        match = r"q: only the fast forward .*fast=False.*\(drop --compile"
        with pytest.raises(ModelLoadError, match=match):
            lm.compile([1])
        assert lm.compiled is None


def _broken(result: Callable[..., Any]) -> Callable[..., Any]:
    """A stand-in for torch.compile whose graphs run ``result`` on the forward's output."""

    def compile_(forward: Callable[..., Any], **kw: Any) -> Callable[..., Any]:
        return lambda *args: result(forward(*args))

    return compile_


def _raise(out: Any) -> Any:
    """A graph that fails as a compile without a C++ compiler would."""
    raise RuntimeError("InductorError: no C++ compiler found")


def _off(out: Any) -> Any:
    """A graph whose logits are off by 1."""
    return (out[0] + 1.0, out[1], out[2])


@pytest.mark.parametrize(
    ("result", "match"),
    [
        (
            _raise,
            r"model: torch.compile of the forward for 1 token\(s\) failed \(RuntimeError: .*\); "
            r"inductor needs a C\+\+ compiler",
        ),
        (_off, r"model: the compiled forward's logits for 1 token\(s\) differ .*\(drop --compile"),
    ],
    ids=["compile-fails", "graph-disagrees"],
)
def test_a_failed_or_disagreeing_compile_is_refused_and_the_model_runs_eager(
    result: Callable[..., Any], match: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A compile that raises or a graph whose logits differ from the eager forward's is a
    ModelLoadError naming the count; the model keeps its eager forward."""
    lm = HFCausalLM(tiny.model("llama", num_hidden_layers=1), vocab_size=tiny.VOCAB)
    monkeypatch.setattr(torch, "compile", _broken(result))
    with pytest.raises(ModelLoadError, match=match):
        lm.compile([1])
    assert lm.compiled is None
    assert lm.fast_forward is not None


def test_the_attention_operator_outside_a_compiled_forward_is_refused() -> None:
    """specstrat::attend called by hand, with no forward's backend set, says where it runs."""
    q = torch.zeros(1, 2, 4)
    with pytest.raises(InvalidConfig, match="runs only inside a compiled specstrat forward"):
        torch.ops.specstrat.attend(q, q, q, 0, None, None, None)


def test_the_cli_refuses_compile_where_nothing_compiles() -> None:
    """``--compile`` on the embedded byte models is refused naming the flag and the fix; a
    count that is not an int >= 1 is refused by the flag's parser; repeats are dropped."""
    with pytest.raises(InvalidConfig, match=r"--compile 1,4: only a Hugging Face model's"):
        compile_target(specstrat.runtime.EmbeddedModels.load(), (1, 4))
    with pytest.raises(argparse.ArgumentTypeError, match=r"'0,x' is not an int >= 1"):
        int_list("0,x")
    assert int_list("4,1,4") == (4, 1)


@pytest.mark.slow  # compiles: seconds each
def test_packed_matmuls_run_in_the_graph_on_the_copies_packed_at_load(
    ids: tuple[int, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the plan runs a count's matmuls on oneDNN-packed copies, the graph calls them
    through specstrat::packed_linear and gives the eager forward's logits."""
    if not torch.backends.mkldnn.is_available():  # type: ignore[no-untyped-call]
        pytest.skip("torch without oneDNN packs no weights")
    lm = HFCausalLM(tiny.model("llama", num_hidden_layers=1), vocab_size=tiny.VOCAB)
    fast = lm.fast_forward
    assert fast is not None
    fast.plan = fast.head_plan = MatmulPlan({3: ("packed", 3)})
    fast.pack_weights()
    runs: list[str] = []

    def spy(form: str, *args: Any) -> torch.Tensor:
        runs.append(form)
        return run_packed(form, *args)

    monkeypatch.setattr("specstrat.hf.compiled_forward.run_packed", spy)
    lm.compile([3])
    tokens, positions = torch.tensor(ids[:3]), torch.arange(3)
    with torch.inference_mode():
        got, _ = lm(tokens, positions, Probe())
        lm.compiled = None
        want, _ = lm(tokens, positions, Probe())
    assert runs.count("packed") >= 5  # the layer's four matmuls and the LM head, each call
    # inductor sums in another order: the graphs differ from eager in the last bits
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.slow  # compiles: seconds each
def test_inputs_no_graph_was_compiled_for_run_eagerly_without_compiling(
    compiled: HFCausalLM, ids: tuple[int, ...]
) -> None:
    """A forward of a compiled count with int32 tokens and positions (the graphs were compiled
    for int64) compiles nothing mid-run and gives the eager forward's logits."""
    graphs = dict(counters["stats"]).get("unique_graphs", 0)
    tokens = torch.tensor(ids[:1], dtype=torch.int32)
    positions = torch.tensor([7], dtype=torch.int32)
    with torch.inference_mode():
        got, _ = compiled(tokens, positions, Probe())
        fast = compiled.fast_forward
        assert fast is not None
        want = fast(tokens.long(), positions.long(), Probe())[0][:, : tiny.VOCAB]
    assert dict(counters["stats"]).get("unique_graphs", 0) == graphs
    # inductor sums in another order: the graphs differ from eager in the last bits
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.slow  # compiles: seconds each
def test_the_bench_records_the_compiled_counts(compiled: HFCausalLM, tokenizer: Any) -> None:
    """A bench run on a compiled target records its counts in ``setup["compile"]``; on the
    eager embedded models, ``None``."""
    config = BenchConfig(
        algorithms=("NGRAM",), workload="code", requests=1, max_new_tokens=4, repeats=1
    )
    models = HFModels(target=compiled, tokenizer=tokenizer, eos_token_ids=frozenset({0}))
    assert run_bench(config, models).setup["compile"] == [1, 4]
    embedded = specstrat.runtime.EmbeddedModels.load()
    assert run_bench(config, embedded).setup["compile"] is None


@pytest.mark.slow  # compiles: seconds each
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_narrow_model_compiles_within_its_dtypes_tolerance(dtype: torch.dtype) -> None:
    """A bfloat16 or float16 model compiles: its graph is not held to float32's tolerance,
    which its own rounding exceeds."""
    lm = HFCausalLM(tiny.model("llama", num_hidden_layers=1).to(dtype), vocab_size=tiny.VOCAB)
    lm.compile([1])
    assert lm.compiled is not None


@pytest.mark.slow  # compiles: seconds each
def test_compiling_a_model_changed_since_wrapping_compiles_the_changed_model(
    ids: tuple[int, ...],
) -> None:
    """A weight written in place before compile() is proven into a new fast forward first, so
    the graphs compute the changed model and are kept."""
    lm = HFCausalLM(tiny.model("llama", num_hidden_layers=1), vocab_size=tiny.VOCAB)
    with torch.no_grad():
        lm.model.lm_head.weight.mul_(2)
    lm.compile([1])
    tokens, positions = torch.tensor(ids[:1]), torch.tensor([0])
    with torch.inference_mode():
        logits, _ = lm(tokens, positions, Probe())
        with lm.reference() as model:
            want = model(tokens[None], position_ids=positions[None]).logits[0]
    assert lm.compiled is not None
    # inductor sums in another order: the graphs differ from eager in the last bits
    torch.testing.assert_close(logits, want[:, : tiny.VOCAB], rtol=1e-5, atol=1e-5)


def test_the_cli_names_the_flag_for_counts_the_model_refuses(
    plain: HFCausalLM, tokenizer: Any
) -> None:
    """Counts past what the model holds, given as --compile, are refused naming the flag."""
    models = HFModels(target=plain, tokenizer=tokenizer)
    with pytest.raises(
        InvalidConfig, match=r"--compile 1,513: token_counts=\[1, 513\]: .* 1 to 512"
    ):
        compile_target(models, (1, 513))
    assert plain.compiled is PREVIOUS


def test_a_torch_without_set_stance_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """A torch before 2.6 (no torch.compiler.set_stance, which keeps a run from compiling
    mid-run) is refused at compile() naming the version and the fix."""
    lm = HFCausalLM(tiny.model("llama", num_hidden_layers=1), vocab_size=tiny.VOCAB)
    monkeypatch.delattr(torch.compiler, "set_stance")
    with pytest.raises(ModelLoadError, match=r"needs torch >= 2.6 .* upgrade torch, or run"):
        lm.compile([1])
    assert lm.compiled is None


def test_a_fault_inside_a_graphs_attention_leaks_nothing_and_the_next_run_is_lossless(
    ids: tuple[int, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An attention that raises mid-decode inside a graph fails the run with its own error,
    leaves no backend set for the operator, and a new engine on the same graphs is lossless."""
    lm = HFCausalLM(tiny.model("llama", num_hidden_layers=2), vocab_size=tiny.VOCAB)
    with monkeypatch.context() as patch:  # graphs that run the forward through the operators
        patch.setattr(torch, "compile", _broken(lambda out: out))
        lm.compile([1])
    served = _counting(monkeypatch)
    attend, calls = PagedAttention.__call__, [0]

    def faulty(self: PagedAttention, *args: Any, **kw: Any) -> torch.Tensor:
        calls[0] += 1
        if served and calls[0] > 8:
            raise RuntimeError("planted attention fault")
        return attend(self, *args, **kw)

    requests = [Request("a", ids[:12], 8)]
    config = EngineConfig(context_len=64, max_running_requests=1)
    with monkeypatch.context() as patch:
        patch.setattr(PagedAttention, "__call__", faulty)
        with pytest.raises(RuntimeError, match="planted attention fault"):
            Engine("NONE", ModelSet(target=lm), config).run(requests)
    assert served
    assert cf._BACKEND.get() is None
    outputs = Engine("NONE", ModelSet(target=lm), config).run(requests)
    check = compare(lm, requests, outputs, generate_reference(lm, requests))
    assert check.lossless, check.line()
    assert len(served) > 1
