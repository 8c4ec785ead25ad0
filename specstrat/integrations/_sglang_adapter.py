"""The class SGLang registers for a specstrat algorithm, and the disaggregation conversions.

SGLang constructs its registered algorithm object itself, from a ``CustomSpecAlgo`` subclass,
so each registered specstrat algorithm gets one generated subclass: :class:`SpecstratSpecAlgo`'s
methods first (they answer from the algorithm's strategies and capabilities), SGLang's
``CustomSpecAlgo`` after (its ``is_*`` identity answers, all False, and what specstrat has no
opinion on: mixed chunks, grammar overlap, server-args handling, ``create_worker``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from specstrat.algorithm import SpecAlgorithm
from specstrat.batch import PrebuiltBatch
from specstrat.errors import InvalidStrategy
from specstrat.integrations._sglang_import import SGLangModules, import_sglang_module
from specstrat.strategies.disagg import (
    DflashDisaggDraftBuilder,
    DflashDraftInput,
    DsparkDisaggDraftBuilder,
    DsparkDraftInput,
    EagleDisaggDraftBuilder,
    EagleDraftInput,
    NoDraftStateDisaggDraftBuilder,
)

__all__ = [
    "BUILTIN_BUILDERS",
    "SGLangBinding",
    "SpecstratSpecAlgo",
    "ToSpecInput",
    "builtin_spec_input",
    "make_spec_class",
    "prebuilt_batch_from_schedule_batch",
]

#: Converts the draft input an algorithm's disagg builder returned into an SGLang ``SpecInput``.
ToSpecInput = Callable[[Any], Any]

#: Built-in builders whose draft inputs :func:`builtin_spec_input` converts.
BUILTIN_BUILDERS: tuple[type, ...] = (
    EagleDisaggDraftBuilder,
    DsparkDisaggDraftBuilder,
    DflashDisaggDraftBuilder,
    NoDraftStateDisaggDraftBuilder,
)


@dataclass(frozen=True, slots=True)
class SGLangBinding:
    """A specstrat algorithm as SGLang sees it: the algorithm and its draft-input conversion.

    ``to_spec_input`` is required when the algorithm's disagg builder is not a built-in one
    (its draft type is the user's, and SGLang's ``SpecInputType`` is a closed enum: the user
    decides which SGLang input carries it).
    """

    algorithm: SpecAlgorithm[Any]
    to_spec_input: ToSpecInput | None = None

    def __post_init__(self) -> None:
        name = self.algorithm.name
        if self.to_spec_input is not None and not callable(self.to_spec_input):
            raise InvalidStrategy(
                f"to_spec_input={self.to_spec_input!r} is not callable; pass a function "
                "draft_input -> SGLang SpecInput"
            )
        if self.to_spec_input is None and not isinstance(self.algorithm.disagg, BUILTIN_BUILDERS):
            raise InvalidStrategy(
                f"{name}: disagg={type(self.algorithm.disagg).__name__} returns a draft type the "
                "adapter cannot convert to an SGLang SpecInput; pass to_spec_input=f where "
                "f(draft_input) returns the SGLang SpecInput (SpecInputType is a closed enum: "
                "reuse e.g. sglang's EagleDraftInput)"
            )

    def spec_input(self, draft: object) -> Any:
        """The SGLang ``SpecInput`` for ``draft`` (``None`` stays ``None``: plain decode)."""
        if draft is None:
            return None
        if self.to_spec_input is not None:
            return self.to_spec_input(draft)
        return builtin_spec_input(draft)


def builtin_spec_input(draft: object) -> Any:
    """SGLang's own draft input for a built-in specstrat draft input (imports SGLang's class).

    EAGLE: ``eagle_info.EagleDraftInput`` (top-k, hidden states, the bonus token; hidden
    capture LAST, as SGLang's builder sets). DSPARK and DFLASH: the ``DFlashDraftInputV2`` their
    SGLang builders make from the bonus tokens and sequence lengths.
    """
    if isinstance(draft, EagleDraftInput):
        eagle_info = import_sglang_module("sglang.srt.speculative.eagle_info")
        forward = import_sglang_module("sglang.srt.model_executor.forward_batch_info")
        return eagle_info.EagleDraftInput(
            topk_p=draft.topk_p,
            topk_index=draft.topk_index,
            hidden_states=draft.hidden_states,
            bonus_tokens=draft.verified_id,
            capture_hidden_mode=forward.CaptureHiddenMode.LAST,
        )
    if isinstance(draft, DsparkDraftInput):
        dspark = import_sglang_module("sglang.srt.speculative.dspark_components.dspark_draft")
        return dspark.make_next_draft_input(
            bonus_tokens=draft.bonus_tokens, new_seq_lens=draft.seq_lens
        )
    if isinstance(draft, DflashDraftInput):
        common = import_sglang_module("sglang.srt.speculative.draft_worker_common")
        return common.make_draft_input_v2(
            bonus_tokens=draft.verified_id, new_seq_lens=draft.seq_lens
        )
    raise InvalidStrategy(
        f"draft input {type(draft).__name__} is not a built-in specstrat draft type; register "
        "the algorithm with to_spec_input=f to convert it"
    )


def _stacked(
    values: Sequence[object], dtype: torch.dtype | None, device: torch.device
) -> torch.Tensor | None:
    """One ``[bs, ...]`` tensor from per-request values; ``None`` if any request lacks it."""
    if not values or any(v is None for v in values):
        return None
    rows = [torch.as_tensor(v, dtype=dtype) for v in values]
    return torch.stack(rows).to(device)


def prebuilt_batch_from_schedule_batch(
    batch: Any, *, need_topk: bool, carries_hidden_states: bool, topk_states: int | None
) -> PrebuiltBatch:
    """specstrat's :class:`~specstrat.batch.PrebuiltBatch` from an SGLang ``ScheduleBatch``.

    Reads ``batch.reqs`` (``rid``; ``output_topk_p``/``output_topk_index`` when the algorithm
    needs top-k, the first ``topk_states`` of each; ``hidden_states_tensor`` when it carries
    hidden states), ``req_pool_indices`` (the slots), ``seq_lens`` and ``device``. Each field is
    stacked once, here; a field some request lacks stays ``None``, and the algorithm's builder
    then names those requests (:class:`~specstrat.errors.DisaggError`).
    """
    device = torch.device(batch.device)
    reqs = list(batch.reqs)
    topk_p = topk_index = hidden = None
    if need_topk:
        cut = slice(topk_states)
        topk_p = _stacked(
            [None if r.output_topk_p is None else r.output_topk_p[cut] for r in reqs],
            torch.float32,
            device,
        )
        topk_index = _stacked(
            [None if r.output_topk_index is None else r.output_topk_index[cut] for r in reqs],
            torch.int64,
            device,
        )
    if carries_hidden_states:
        hidden = _stacked([r.hidden_states_tensor for r in reqs], None, device)
    return PrebuiltBatch(
        rids=tuple(str(r.rid) for r in reqs),
        slots=batch.req_pool_indices,
        seq_lens=batch.seq_lens,
        topk_p=topk_p,
        topk_index=topk_index,
        hidden_states=hidden,
        device=device,
    )


def _topk_states() -> int:
    """Top-k entries per request that crossed disaggregation, from SGLang's speculative config."""
    spec = import_sglang_module("sglang.srt.runtime_context").get_spec()
    states = int(spec.speculative_eagle_topk)
    return states * int(spec.speculative_num_steps) if spec.enable_multi_layer_eagle else states


class SpecstratSpecAlgo:
    """The methods of every generated class: SGLang's hooks, answered by the specstrat algorithm.

    ``specstrat`` is the class's :class:`SGLangBinding`; ``name`` is set by SGLang's
    ``CustomSpecAlgo.__init__`` (upper case). Identity questions (``is_eagle()``, ...) are left
    to ``CustomSpecAlgo`` and answer False.
    """

    specstrat: ClassVar[SGLangBinding]
    name: str

    def supports_target_verify_for_draft(self) -> bool:
        """Whether a draft worker may run TARGET_VERIFY (SGLang's decode CUDA-graph runner)."""
        return self.specstrat.algorithm.supports_target_verify_for_draft()

    def get_num_tokens_per_req_for_target_verify(
        self, num_draft_tokens: int, is_draft_worker: bool
    ) -> int:
        """Tokens per request TARGET_VERIFY runs (SGLang's ``resolve_num_tokens_per_req``)."""
        return self.specstrat.algorithm.get_num_tokens_per_req_for_target_verify(
            num_draft_tokens, is_draft_worker
        )

    def has_draft_kv(self) -> bool:
        """Whether drafting writes KV (SGLang's ``get_alloc_len_per_decode``)."""
        return self.specstrat.algorithm.capabilities.has_draft_kv

    def supports_ragged_verify(self) -> bool:
        """Whether verify may carry per-request token counts (SGLang's ragged verify graphs)."""
        return self.specstrat.algorithm.capabilities.supports_ragged_verify

    def need_topk(self) -> bool:
        """Whether the relay carries top-k (SGLang's ``FutureMap`` buffer set-up)."""
        return self.specstrat.algorithm.capabilities.need_topk

    def carries_draft_hidden_states(self) -> bool:
        """Whether hidden states cross disaggregation (SGLang's ``init_disaggregation``)."""
        return self.specstrat.algorithm.capabilities.carries_draft_hidden_states

    def get_platform_worker_cls(self) -> type | None:
        """``None``: the worker given at registration runs this algorithm on every platform."""
        return None

    def create_future_map(
        self,
        device: torch.device,
        req_to_token_pool: Any,
        needs_cpu_seq_lens: bool = True,
        needs_confidence_relay: bool = False,
    ) -> Any:
        """SGLang's own ``FutureMap`` for this algorithm (SGLang 0.5.23's arguments).

        SGLang's scheduler reads the map's buffers directly, so the relay is SGLang's, not the
        algorithm's ``future_map`` strategy: specstrat's relay strategies do not run inside
        SGLang. The arguments are 0.5.23's ``Scheduler.init_overlap`` call; the seed-era hook
        (and specstrat's ``FutureMapFactory``) took ``(max_running_requests,
        chunked_prefill_size, context_len, device)`` instead.
        """
        overlap_utils = import_sglang_module("sglang.srt.managers.overlap_utils")
        return overlap_utils.FutureMap(
            device, self, req_to_token_pool, needs_cpu_seq_lens, needs_confidence_relay
        )

    def build_disagg_draft_input(
        self, batch: Any, last_tokens_tensor: torch.Tensor, future_map: Any
    ) -> Any:
        """The algorithm's disagg builder on a received SGLang batch (``process_prebuilt``).

        The batch becomes a :class:`~specstrat.batch.PrebuiltBatch` once; the builder runs
        without a specstrat relay, and its draft input becomes an SGLang ``SpecInput``. With
        overlap on, the relay writes SGLang's builders make happen here too: the batch's
        sequence lengths are published and the bonus tokens (plus the transferred top-k and
        hidden states) stashed at its pool slots. ``None`` means no draft state: SGLang then
        stashes the last tokens itself.
        """
        algorithm = self.specstrat.algorithm
        caps = algorithm.capabilities
        prebuilt = prebuilt_batch_from_schedule_batch(
            batch,
            need_topk=caps.need_topk,
            carries_hidden_states=caps.carries_draft_hidden_states,
            topk_states=_topk_states() if caps.need_topk else None,
        )
        draft = algorithm.build_disagg_draft_input(prebuilt, last_tokens_tensor, None)
        spec_input = self.specstrat.spec_input(draft)
        if spec_input is not None and batch.enable_overlap:
            overlap_utils = import_sglang_module("sglang.srt.managers.overlap_utils")
            spec_input.future_indices = batch.req_pool_indices
            future_map.publish(batch.req_pool_indices, batch.seq_lens)
            future_map.stash(
                batch.req_pool_indices,
                overlap_utils.RelayPayload(
                    bonus_tokens=last_tokens_tensor,
                    topk_p=prebuilt.topk_p,
                    topk_index=prebuilt.topk_index,
                    hidden_states=prebuilt.hidden_states,
                ),
            )
        return spec_input


def make_spec_class(binding: SGLangBinding, modules: SGLangModules) -> type:
    """A ``CustomSpecAlgo`` subclass answering SGLang's hooks from ``binding``'s algorithm."""
    name = binding.algorithm.name
    return type(
        f"SpecstratSpecAlgo_{name}",
        (SpecstratSpecAlgo, modules.custom_spec_algo),
        {
            "specstrat": binding,
            "__module__": __name__,
            "__doc__": f"SGLang's view of the specstrat algorithm {name}.",
        },
    )
