"""The README's and the guides' examples build every tensor on the device they are handed
(``step.bonus_tokens.device``, the inputs' device), so what passes on a CPU runs on a GPU. A
CPU-only suite cannot see a CUDA tensor, so each example runs with its inputs on the CPU while
the default device is ``meta``, where a tensor built without ``device=`` lands, and, where it
reads no values, with its inputs on ``meta`` itself."""

import ast
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import fields
from pathlib import Path
from typing import cast

import pytest
import torch

import specstrat
from specstrat import (
    Acceptance,
    DraftKV,
    DraftProposer,
    DraftStep,
    DraftTree,
    RelayPayload,
    VerifyInputs,
)
from specstrat.strategies import NgramDrafter, NoDrafter
from tests.typing.guide_acceptance import TopTwoFirstDraftAcceptance
from tests.typing.guide_draft_lm_drafter import GreedyDraftLMDrafter
from tests.typing.readme_drafter import BigramDrafter

ROOT = Path(__file__).resolve().parents[2]
CPU, META = torch.device("cpu"), torch.device("meta")
VOCAB = 16
#: Committed tokens per slot: bigrams to follow, n-grams to look up.
HISTORY: dict[int, list[int]] = {0: [1, 2, 3, 1, 2], 1: [4, 5, 4, 5, 4], 2: [7, 7, 7, 7, 7]}
#: (bs, max_nodes): no request, a plain step (D = 1), a batch drafting several nodes.
SHAPES = [(0, 3), (1, 0), (3, 4)]
#: Torch calls that build a tensor on the default device unless told ``device=``
#: (``*_like`` and ``Tensor.new_*`` follow the tensor they are given).
FACTORIES = {"tensor", "zeros", "ones", "full", "empty", "arange", "rand", "randn", "randint"}
#: The example files that build tensors, each run below.
RUN_HERE = {
    "tests/typing/readme_drafter.py",
    "tests/typing/guide_draft_lm_drafter.py",
    "tests/typing/guide_acceptance.py",
}


class CpuDraftLM:
    """The draft-LM calls ``GreedyDraftLMDrafter.propose`` makes, answered on the CPU: every
    row caches nothing and predicts token 7."""

    def rows_for(self, slots: Sequence[int]) -> list[int]:
        """One draft row per slot."""
        return list(range(len(slots)))

    def cached(self, rows: Sequence[int]) -> list[int]:
        """Nothing cached."""
        return [0] * len(rows)

    def extend(
        self, rows: Sequence[int], tokens: Sequence[Sequence[int]]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits favouring token 7 and zero hidden states, one row per token, on the CPU."""
        total = sum(map(len, tokens))
        logits = torch.zeros(total, VOCAB, device=CPU)
        logits[:, 7] = 1.0
        return logits, torch.zeros(total, 4, device=CPU)

    def rewind(self, row: int, new_len: int) -> None:
        """Nothing to drop."""


def draft_lm_drafter() -> GreedyDraftLMDrafter:
    """The drafter guide's draft-LM drafter over :class:`CpuDraftLM` (which answers only the
    calls ``propose`` makes: the drafter's other uses need an engine's runner)."""
    return GreedyDraftLMDrafter(cast(DraftKV, CpuDraftLM()), HISTORY.__getitem__)


#: The drafters of the README and the drafter guide, and the built-ins they sit beside.
DRAFTERS: dict[str, Callable[[], DraftProposer]] = {
    "readme_bigram": lambda: BigramDrafter(HISTORY.__getitem__),
    "guide_draft_lm": draft_lm_drafter,
    "builtin_ngram": lambda: NgramDrafter(1, 3, HISTORY.__getitem__),
    "builtin_none": NoDrafter,
}


def draft_step(bs: int, max_nodes: int, device: torch.device) -> DraftStep:
    """A step of ``bs`` requests (slots 0..bs-1) whose tensors are on ``device``."""
    return DraftStep(
        slots=tuple(range(bs)),
        bonus_tokens=torch.tensor([3, 5, 7][:bs], dtype=torch.int64, device=device),
        seq_lens=torch.full((bs,), 5, dtype=torch.int64, device=device),
        payload=RelayPayload(),
        max_nodes=max_nodes,
        sampling=(specstrat.GREEDY,) * bs,
    )


def verify_inputs(bs: int, n: int, device: torch.device) -> VerifyInputs:
    """A chain of ``n`` drafts per request and the target's logits, all on ``device``."""
    tokens = torch.arange(bs * n, dtype=torch.int64, device=device).reshape(bs, n) % VOCAB
    return VerifyInputs(
        drafts=DraftTree.chain(tokens),
        logits=torch.ones(bs, n + 1, VOCAB, device=device).cumsum(-1),
        positions=torch.full((bs,), 5, dtype=torch.int64, device=device),
        sampling=(specstrat.GREEDY,) * bs,
    )


def tensor_devices(answer: DraftTree | Acceptance) -> dict[str, torch.device]:
    """The device of each tensor field of a hook's answer, by field name."""
    return {
        f.name: value.device
        for f in fields(answer)
        if isinstance(value := getattr(answer, f.name), torch.Tensor)
    }


@pytest.mark.parametrize(("bs", "max_nodes"), SHAPES)
@pytest.mark.parametrize("name", DRAFTERS)
def test_drafters_build_their_trees_on_the_steps_device(name: str, bs: int, max_nodes: int) -> None:
    """Each example drafter's tree lies on the step's device (the CPU), not the default
    device (meta), for every batch size and width."""
    drafter = DRAFTERS[name]()
    with torch.device(META):
        tree = drafter.propose(draft_step(bs, max_nodes, CPU))
    assert set(tensor_devices(tree).values()) == {CPU}, tensor_devices(tree)
    assert tuple(tree.tokens.shape) == (bs, tree.num_nodes)


@pytest.mark.parametrize(("bs", "n"), SHAPES)
@pytest.mark.parametrize(("inputs_on", "default"), [(CPU, META), (META, CPU)])
def test_the_acceptance_guide_rule_answers_on_the_inputs_device(
    bs: int, n: int, inputs_on: torch.device, default: torch.device
) -> None:
    """The acceptance guide's rule answers on the device of its inputs, whichever the default
    device is (it reads no values, so it runs on meta too)."""
    inputs = verify_inputs(bs, n, inputs_on)
    with torch.device(default):
        got = TopTwoFirstDraftAcceptance().accept(inputs)
    assert set(tensor_devices(got).values()) == {inputs_on}, tensor_devices(got)


def example_sources() -> dict[str, str]:
    """Every Python example the README and the docs show, by where it is: each file a page
    includes or a block shows verbatim (the README's drafter), each other inline block."""
    sources: dict[str, str] = {}
    shown = {(ROOT / path).read_text(): path for path in RUN_HERE}
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    for page in pages:
        text = page.read_text()
        for at, block in enumerate(re.findall(r"^```python\n(.*?)^```$", text, re.M | re.S)):
            included = re.fullmatch(r'--8<-- "([^"]+\.py)"\n', block)
            if included:
                sources[included[1]] = (ROOT / included[1]).read_text()
            else:
                sources[shown.get(block, f"{page.relative_to(ROOT)} block {at}")] = block
    return sources


def factory_calls(source: str) -> Iterator[ast.Call]:
    """The ``torch.<factory>(...)`` calls of a source."""
    for node in ast.walk(ast.parse(source)):
        func = node.func if isinstance(node, ast.Call) else None
        if (
            isinstance(func, ast.Attribute)
            and func.attr in FACTORIES
            and isinstance(func.value, ast.Name)
            and func.value.id == "torch"
        ):
            yield cast(ast.Call, node)


def test_every_example_factory_call_names_its_device() -> None:
    """Every tensor an example builds names its device (``device=``), and every example file
    that builds one is run above, so no example shown builds on the default device."""
    sources = example_sources()
    assert not RUN_HERE - set(sources), RUN_HERE - set(sources)
    for where, source in sources.items():
        calls = list(factory_calls(source))
        missing = [
            ast.unparse(call) for call in calls if "device" not in {k.arg for k in call.keywords}
        ]
        assert not missing, f"{where} builds on the default device: {missing}"
        assert where in RUN_HERE or not calls, f"{where} builds tensors and is not run here"
