"""The README's and the guides' examples build every tensor on the device they are handed
(``step.bonus_tokens.device``, the inputs' device), so what passes on a CPU runs on a GPU. A
CPU-only suite cannot see a CUDA tensor, so each example runs with its inputs on the CPU while
the default device is ``meta``, where a tensor built without ``device=`` lands, and, where it
reads no values, with its inputs on ``meta`` itself. Neither run sees a device an example names
itself (``device="cpu"`` runs on the CPU inputs), so the examples' source is read too: every
device comes from an input, never a literal."""

import ast
import re
from collections.abc import Callable, Sequence
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
#: Torch calls that build a tensor on the default device unless told ``device=``: the public
#: torch functions whose aten schema takes a ``device`` (torch 2.13), less ``*_like`` and
#: ``Tensor.new_*`` (they follow the tensor they are given) and ``normal`` (its tensor forms do).
FACTORIES = {
    "arange",
    "as_tensor",
    "asarray",
    "bartlett_window",
    "blackman_window",
    "empty",
    "empty_permuted",
    "empty_strided",
    "eye",
    "from_file",
    "full",
    "hamming_window",
    "hann_window",
    "kaiser_window",
    "linspace",
    "logspace",
    "ones",
    "rand",
    "randint",
    "randn",
    "randperm",
    "range",
    "scalar_tensor",
    "sparse_bsc_tensor",
    "sparse_bsr_tensor",
    "sparse_compressed_tensor",
    "sparse_coo_tensor",
    "sparse_csc_tensor",
    "sparse_csr_tensor",
    "tensor",
    "tril_indices",
    "triu_indices",
    "zeros",
}
#: Legacy typed constructors: they build on the CPU whatever the default device, and refuse
#: any other ``device=``.
HOST_ONLY = {
    "Tensor",
    "BoolTensor",
    "ByteTensor",
    "CharTensor",
    "ShortTensor",
    "IntTensor",
    "LongTensor",
    "HalfTensor",
    "BFloat16Tensor",
    "FloatTensor",
    "DoubleTensor",
}
#: Tensor methods that move a tensor to a device they name themselves.
MOVES = {"cpu", "cuda"}
#: Why each refused call is refused, and the fix, as the messages say it.
DEFAULT = "builds on the default device; pass device= taken from an input"
HARD_CODED = (
    "hard-codes its device; take it from an input (step.bonus_tokens.device, logits.device)"
)
CPU_ONLY = "builds on the CPU whatever the device; use torch.tensor(..., device=...)"
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


def example_sources() -> dict[tuple[str, int], str]:
    """Every Python example the README and the docs show, by where its first line is: each file
    a page includes or a block shows verbatim (the README's drafter) at its line 1, each other
    inline block at its page's line."""
    sources: dict[tuple[str, int], str] = {}
    shown = {(ROOT / path).read_text(): path for path in RUN_HERE}
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    for page in pages:
        text = page.read_text()
        for found in re.finditer(r"^```python\n(.*?)^```$", text, re.M | re.S):
            block = found[1]
            included = re.fullmatch(r'--8<-- "([^"]+\.py)"\n', block)
            if included:
                sources[included[1], 1] = (ROOT / included[1]).read_text()
            elif block in shown:
                sources[shown[block], 1] = block
            else:
                line = text.count("\n", 0, found.start(1)) + 1
                sources[str(page.relative_to(ROOT)), line] = block
    return sources


def is_torch(func: ast.expr, names: set[str]) -> bool:
    """``func`` is ``torch.<name>`` for one of ``names``."""
    return (
        isinstance(func, ast.Attribute)
        and func.attr in names
        and isinstance(func.value, ast.Name)
        and func.value.id == "torch"
    )


def hard_codes_device(call: ast.Call) -> bool:
    """The call names a device itself: ``device=`` a constant (``"cpu"``, ``None``),
    ``torch.device("cuda")``, ``.to("cpu")``, ``.cpu()`` or ``.cuda()``."""
    func, given = call.func, [*call.args, *(k.value for k in call.keywords)]
    if any(k.arg == "device" and isinstance(k.value, ast.Constant) for k in call.keywords):
        return True
    if is_torch(func, {"device"}):
        return bool(given) and all(isinstance(arg, ast.Constant) for arg in given)
    if isinstance(func, ast.Attribute) and func.attr == "to":
        return any(isinstance(arg, ast.Constant) for arg in call.args)
    return isinstance(func, ast.Attribute) and func.attr in MOVES


def device_faults(source: str, path: str, first_line: int = 1) -> list[str]:
    """Each call of an example that builds or moves a tensor off its inputs' device, as
    ``path:line: code why``, in line order (``first_line``: where the source starts in ``path``).
    A device name held in a variable (``dev = "cuda"``) is not seen; the runs above are."""
    faults: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        if is_torch(node.func, HOST_ONLY):
            why = CPU_ONLY
        elif is_torch(node.func, FACTORIES) and "device" not in {k.arg for k in node.keywords}:
            why = DEFAULT
        elif hard_codes_device(node):
            why = HARD_CODED
        else:
            continue
        line = first_line + node.lineno - 1
        faults.append((line, f"{path}:{line}: {ast.unparse(node)} {why}"))
    return [fault for _, fault in sorted(faults)]


def builds_tensors(source: str) -> bool:
    """The source calls a torch factory, so running it is the only way to see its devices."""
    return any(
        isinstance(node, ast.Call) and is_torch(node.func, FACTORIES)
        for node in ast.walk(ast.parse(source))
    )


def test_every_example_takes_its_devices_from_its_inputs() -> None:
    """No example builds on the default device or a device it names; each file that builds runs."""
    sources = example_sources()
    unseen = RUN_HERE - {path for path, _ in sources}
    assert not unseen, f"{unseen} are run here but no page shows them"
    faults = [
        fault for (path, line), text in sources.items() for fault in device_faults(text, path, line)
    ]
    assert not faults, "\n".join(faults)
    for (path, line), text in sources.items():
        assert path in RUN_HERE or not builds_tensors(text), (
            f"{path}:{line} builds tensors, not run here"
        )


#: Planted bad lines (each the third line of a block at README.md:40, so at README.md:42), and
#: the call the checker must name with its reason.
PLANTED = {
    "device_cpu": ("x = torch.zeros(3, device='cpu')", "torch.zeros(3, device='cpu')", HARD_CODED),
    "device_cuda": ("x = f(n, device='cuda')", "f(n, device='cuda')", HARD_CODED),
    "device_none": ("x = torch.ones(3, device=None)", "torch.ones(3, device=None)", HARD_CODED),
    "torch_device": (
        "x = torch.eye(3, device=torch.device('cpu'))",
        "torch.device('cpu')",
        HARD_CODED,
    ),
    "with_torch_device": (
        "with torch.device('cuda', 0):\n    pass",
        "torch.device('cuda', 0)",
        HARD_CODED,
    ),
    "to_cpu": ("y = x.to('cpu')", "x.to('cpu')", HARD_CODED),
    "to_cuda_non_blocking": (
        "y = x.to('cuda', non_blocking=True)",
        "x.to('cuda', non_blocking=True)",
        HARD_CODED,
    ),
    "to_device_kw": ("y = x.to(device='cpu')", "x.to(device='cpu')", HARD_CODED),
    "cpu": ("y = x.cpu()", "x.cpu()", HARD_CODED),
    "cuda": ("y = x.cuda()", "x.cuda()", HARD_CODED),
    "long_tensor": ("y = torch.LongTensor([1, 2])", "torch.LongTensor([1, 2])", CPU_ONLY),
    "float_tensor": ("y = torch.FloatTensor(3)", "torch.FloatTensor(3)", CPU_ONLY),
    "as_tensor": ("y = torch.as_tensor(rows)", "torch.as_tensor(rows)", DEFAULT),
    "eye": ("y = torch.eye(3)", "torch.eye(3)", DEFAULT),
    "linspace": ("y = torch.linspace(0, 1, 5)", "torch.linspace(0, 1, 5)", DEFAULT),
    "logspace": ("y = torch.logspace(0, 1, 5)", "torch.logspace(0, 1, 5)", DEFAULT),
    "randperm": ("y = torch.randperm(4)", "torch.randperm(4)", DEFAULT),
}


@pytest.mark.parametrize("name", PLANTED)
def test_the_checker_names_each_planted_bad_call_by_page_and_line(name: str) -> None:
    """A planted off-device call is reported alone, by page and line, with its reason and fix."""
    line, call, why = PLANTED[name]
    source = f"import torch\n\n{line}\n"
    assert device_faults(source, "README.md", 40) == [f"README.md:42: {call} {why}"]


def test_the_checker_passes_devices_taken_from_inputs() -> None:
    """Devices read off inputs, dtype moves, ``*_like`` builders and device-type tests pass."""
    source = """
dev = step.bonus_tokens.device
a = torch.zeros(bs, 0, dtype=torch.int64, device=dev)
b = torch.tensor(rows, device=logits.device).to(dev).to(torch.int64)
c = torch.zeros_like(a), a.new_zeros(3), a.tolist(), torch.device(name)
d = bufs.allocate(padded_bs, device=seq_lens.device) if dev.type == "cuda" else a
"""
    assert device_faults(source, "README.md") == []
