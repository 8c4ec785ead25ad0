"""Stand-ins for the SGLang pieces that do not import without CUDA-only builds.

The light venv imports SGLang's registry, ``spec_info``, ``overlap_utils``, ``runtime_context``
and ``allocation_sizing``; ``spec_utils``, ``scheduler``, ``schedule_batch`` and the draft-input
classes (``eagle_info``, ``dflash_info_v2``) need ``transformers``/``torchvision`` builds that
exist here only for SGLang's CUDA torch. What stands in for them:

* :func:`spec_utils_functions`: SGLang's own ``resolve_num_tokens_per_req`` and
  ``spec_need_hidden_states``, compiled from the installed ``spec_utils.py`` source alone (the
  function bodies as released; only the module's imports are left out).
* :func:`schedule_batch`: the fields of a ``ScheduleBatch`` the adapter reads.
* :func:`draft_input_modules`: recording doubles of SGLang's draft-input constructors.
"""

import __future__

import ast
import importlib
import importlib.util
import typing
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import torch

from specstrat import NGRAM, DisaggError, PrebuiltBatch, SpecAlgorithm

#: Whether this venv has SGLang (the main venv does not; .venv-sglang does).
HAVE_SGLANG = importlib.util.find_spec("sglang") is not None
SPEC_UTILS_FUNCTIONS = ("resolve_num_tokens_per_req", "spec_need_hidden_states")


class UserDisaggDraftBuilder:
    """A builder with its own draft type (a tuple), which SGLang has no input class for.

    Its return is typed ``Any`` so NGRAM's drafter (which starts from no draft state) fits.
    """

    def build_disagg_draft_input(
        self, batch: PrebuiltBatch, last_tokens: torch.Tensor, future_map: Any
    ) -> Any:
        if future_map is not None:
            raise DisaggError("the adapter runs builders without a specstrat relay")
        return (last_tokens, batch.seq_lens)


USER_DRAFT: SpecAlgorithm[Any] = replace(NGRAM, name="USER_DRAFT", disagg=UserDisaggDraftBuilder())


class StandInWorker:
    """What SGLang would instantiate as the speculative worker (never run here)."""


def spec_config(**fields: object) -> SimpleNamespace:
    """SGLang's speculative config bag (``runtime_context.get_spec()``), as a namespace."""
    defaults: dict[str, object] = {
        "speculative_algorithm": None,
        "speculative_num_steps": 3,
        "speculative_eagle_topk": 1,
        "speculative_num_draft_tokens": 4,
        "enable_multi_layer_eagle": False,
    }
    return SimpleNamespace(**{**defaults, **fields})


def spec_utils_functions(get_spec: Callable[[], object]) -> ModuleType:
    """SGLang's ``spec_utils`` functions that read only ``get_spec()``, from its own source."""
    root = Path(importlib.import_module("sglang").__file__ or "").parent
    path = root / "srt" / "speculative" / "spec_utils.py"
    tree = ast.parse(path.read_text(), str(path))
    body: list[ast.stmt] = [
        node
        for node in tree.body
        if isinstance(node, ast.FunctionDef) and node.name in SPEC_UTILS_FUNCTIONS
    ]
    assert len(body) == len(SPEC_UTILS_FUNCTIONS), f"{path} lacks {SPEC_UTILS_FUNCTIONS}"
    module = ModuleType("sglang.srt.speculative.spec_utils")
    module.__dict__.update(get_spec=get_spec, Literal=typing.Literal, Optional=typing.Optional)
    code = compile(
        ast.Module(body=body, type_ignores=[]),
        str(path),
        "exec",
        flags=__future__.annotations.compiler_flag,
        dont_inherit=True,
    )
    exec(code, module.__dict__)
    return module


def request(
    rid: str,
    *,
    topk: list[float] | None = None,
    topk_index: list[int] | None = None,
    hidden: torch.Tensor | None = None,
) -> SimpleNamespace:
    """A received request as ``process_prebuilt`` sees it (what the prefill side sent)."""
    return SimpleNamespace(
        rid=rid, output_topk_p=topk, output_topk_index=topk_index, hidden_states_tensor=hidden
    )


def schedule_batch(
    reqs: list[SimpleNamespace], slots: list[int], seq_lens: list[int], *, overlap: bool = True
) -> SimpleNamespace:
    """The ``ScheduleBatch`` fields the adapter reads, on the CPU."""
    return SimpleNamespace(
        reqs=reqs,
        req_pool_indices=torch.tensor(slots, dtype=torch.int64),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int64),
        device="cpu",
        enable_overlap=overlap,
    )


class Recorded(SimpleNamespace):
    """A stand-in SGLang draft input: the constructor's keyword arguments, plus ``kind``."""


def _recorder(kind: str) -> Callable[..., Recorded]:
    def make(**kwargs: Any) -> Recorded:
        return Recorded(kind=kind, future_indices=None, **kwargs)

    return make


def draft_input_modules() -> dict[str, ModuleType]:
    """Recording doubles of the modules holding SGLang's draft-input constructors."""
    eagle = ModuleType("sglang.srt.speculative.eagle_info")
    eagle.EagleDraftInput = _recorder("EagleDraftInput")  # type: ignore[attr-defined]
    forward = ModuleType("sglang.srt.model_executor.forward_batch_info")
    forward.CaptureHiddenMode = SimpleNamespace(LAST="LAST")  # type: ignore[attr-defined]
    dspark = ModuleType("sglang.srt.speculative.dspark_components.dspark_draft")
    dspark.make_next_draft_input = _recorder("dspark make_next_draft_input")  # type: ignore[attr-defined]
    common = ModuleType("sglang.srt.speculative.draft_worker_common")
    common.make_draft_input_v2 = _recorder("make_draft_input_v2")  # type: ignore[attr-defined]
    return {m.__name__: m for m in (eagle, forward, dspark, common)}


def req_to_token_pool(rows: int = 8, width: int = 16) -> SimpleNamespace:
    """SGLang's ``ReqToTokenPool`` as ``FutureMap`` reads it (``req_to_token``)."""
    return SimpleNamespace(req_to_token=torch.zeros((rows, width), dtype=torch.int32))
