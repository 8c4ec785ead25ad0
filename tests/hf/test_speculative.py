"""Speculation on Hugging Face models: a draft LM (STANDALONE) with chains and top-k trees is
greedy-lossless against transformers' generate, sampling with rejection is reproducible by seed,
and a request stops at its EOS id as generate does."""

from dataclasses import replace
from typing import Any

import pytest

import specstrat
from specstrat import ModelSet, SamplingParams, SpecAlgorithm
from specstrat.hf import HFCausalLM, compare, generate_reference
from specstrat.runtime import Engine, EngineConfig, Request
from specstrat.strategies import TopkTree
from tests.hf import tiny

TREE = replace(specstrat.STANDALONE, tree=TopkTree(topk=2, num_steps=3))
ALGOS = {"chain": specstrat.STANDALONE, "tree": TREE}
EOS = 0  # the tiny tokenizer's <eos>


@pytest.fixture(scope="module")
def models() -> dict[str, HFCausalLM]:
    """A 3-layer llama target; drafts over the same vocabulary: a 1-layer llama of another seed
    (drafts mostly rejected) and the target's own model wrapped a second time (all accepted)."""
    big = tiny.model("llama", num_hidden_layers=3)
    return {
        "target": HFCausalLM(big, vocab_size=tiny.VOCAB, name="target"),
        "small": HFCausalLM(
            tiny.model("llama", seed=1, num_hidden_layers=1), vocab_size=tiny.VOCAB, name="small"
        ),
        "same": HFCausalLM(big, vocab_size=tiny.VOCAB, name="same"),
    }


@pytest.fixture(scope="module")
def requests(ids: tuple[int, ...]) -> list[Request]:
    """Three greedy requests of different lengths, no stop ids."""
    return [Request("a", ids[:20], 16), Request("b", ids[:6], 10), Request("c", ids[:33], 12)]


@pytest.mark.parametrize("overlap", [False, True], ids=["sync", "overlap"])
@pytest.mark.parametrize("shape", ["chain", "tree"])
@pytest.mark.parametrize("draft", ["small", "same"])
def test_a_draft_lm_with_chains_and_trees_is_greedy_lossless(
    draft: str,
    shape: str,
    overlap: bool,
    models: dict[str, HFCausalLM],
    requests: list[Request],
) -> None:
    """STANDALONE with a draft LM, as a chain and as a top-k tree (topk 2, 3 steps), gives
    transformers' greedy generate token for token; the target's own weights as draft speculate."""
    target = models["target"]
    config = EngineConfig(context_len=80, overlap=overlap)
    engine = Engine(ALGOS[shape], ModelSet(target=target, draft=models[draft]), config)
    outputs = engine.run(requests)
    check = compare(target, requests, outputs, generate_reference(target, requests))
    assert check.lossless, check.line()
    assert check.compared_tokens == 38
    if draft == "same":
        assert engine.stats.acceptance_length >= 2.5


def sampled(requests: list[Request], seed: int) -> list[Request]:
    """The requests at temperature 0.8, request i seeded ``seed + i``."""
    return [
        replace(r, sampling=SamplingParams(temperature=0.8, seed=seed + i))
        for i, r in enumerate(requests)
    ]


@pytest.mark.parametrize(
    ("algo", "draft"),
    [(TREE, "same"), (specstrat.STANDALONE, "small"), (specstrat.NGRAM, None)],
    ids=["tree-same", "chain-small", "ngram"],
)
def test_sampling_is_reproducible_by_seed(
    algo: SpecAlgorithm[Any],
    draft: str | None,
    models: dict[str, HFCausalLM],
    requests: list[Request],
) -> None:
    """Rejection sampling at temperature 0.8 gives the same outputs for the same seeds on a new
    engine, other outputs for other seeds, every id in the tokenizer's vocabulary."""
    drafts = ModelSet(target=models["target"], draft=models[draft] if draft else None)

    def run(seed: int) -> dict[str, list[int]]:
        return Engine(algo, drafts, EngineConfig(context_len=80)).run(sampled(requests, seed))

    first, again, other = run(1), run(1), run(2)
    assert first == again
    assert first != other
    assert {rid: len(out) for rid, out in first.items()} == {"a": 16, "b": 10, "c": 12}
    assert all(0 <= t < tiny.VOCAB for out in [*first.values(), *other.values()] for t in out)


@pytest.mark.parametrize(
    ("algo", "draft"),
    [(specstrat.NONE, None), (specstrat.NGRAM, None), (TREE, "same"), (TREE, "small")],
    ids=["none", "ngram", "tree-same", "tree-small"],
)
def test_a_request_stops_at_its_eos_id_like_generate(
    algo: SpecAlgorithm[Any],
    draft: str | None,
    models: dict[str, HFCausalLM],
    ids: tuple[int, ...],
) -> None:
    """With <eos> in stop_token_ids a request ends at the first <eos> (kept as its last token),
    as transformers' generate does with it as eos_token_id; without it, it runs on past it."""
    target = models["target"]
    stopping = Request("eos", ids[:8], 12, frozenset({EOS}))
    running = Request("run", ids[:8], 12)
    reference = generate_reference(target, [stopping, running])
    assert EOS in reference["run"][:-1]  # greedy reaches <eos> early after this prompt
    drafts = ModelSet(target=target, draft=models[draft] if draft else None)
    outputs = Engine(algo, drafts, EngineConfig(context_len=80)).run([stopping, running])
    assert outputs["eos"] == reference["eos"]
    assert outputs["eos"][-1] == EOS
    assert len(outputs["eos"]) == reference["run"].index(EOS) + 1
    assert outputs["run"] == reference["run"]


@pytest.mark.parametrize(
    ("family", "window"),
    [("mistral", {"sliding_window": 6}), ("gemma2", {}), ("qwen2-window", {})],
    ids=["mistral-w6", "gemma2-w8", "qwen2-w6-one-layer"],
)
def test_a_top_k_tree_is_lossless_on_a_sliding_window_model(
    family: str, window: dict[str, Any], ids: tuple[int, ...]
) -> None:
    """STANDALONE under a top-k tree with the target's own weights as draft (deep acceptance)
    gives generate's tokens on models whose window is shorter than the prompts."""
    requests = [Request("a", ids[:20], 12), Request("b", ids[:5], 9)]
    model = tiny.model(family, num_hidden_layers=3, **window)
    target = HFCausalLM(model, vocab_size=tiny.VOCAB, name="target")
    drafts = ModelSet(target=target, draft=HFCausalLM(model, vocab_size=tiny.VOCAB, name="same"))
    outputs = Engine(TREE, drafts, EngineConfig(context_len=80)).run(requests)
    check = compare(target, requests, outputs, generate_reference(target, requests))
    assert check.lossless, check.line()
