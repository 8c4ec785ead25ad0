"""TARGET_VERIFY through static buffers per batch bucket, replayed with in-place metadata.

For each bucket ``padded_bs`` the runner owns static input buffers (``padded_bs * T`` tokens) and
static metadata buffers, with ``T = algo.get_num_tokens_per_req_for_target_verify(D,
is_draft_worker)``. A replay copies the real batch into the buffers (padding rows point at the
padding request row 0 and KV slot 0), rebuilds the metadata in place
(:func:`~specstrat.kernels.build_verify_metadata_into`: one launch, no allocation, no host sync)
and runs the model on the static tensors. On CUDA the model forward is captured once per bucket
in a ``torch.cuda.CUDAGraph`` (keys bounded by ``context_len``) and replayed; on the CPU the same
static-buffer path runs eagerly.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from specstrat.algorithm import SpecAlgorithm
from specstrat.errors import InvalidConfig, KernelError
from specstrat.kernels import VerifyMetadataBuffers, build_verify_metadata_into
from specstrat.runtime.forward import ForwardMode
from specstrat.runtime.worker import ModelWorker

__all__ = ["GraphRunner"]


class _Bucket:
    def __init__(self, padded_bs: int, tokens: int, worker: ModelWorker) -> None:
        dev, n = worker.device, padded_bs * tokens

        def zeros(size: int) -> torch.Tensor:
            return torch.zeros(size, dtype=torch.int64, device=dev)

        self.padded_bs = padded_bs
        self.input_ids, self.positions, self.out_cache_loc = zeros(n), zeros(n), zeros(n)
        self.req_pool_indices, self.seq_lens = zeros(padded_bs), zeros(padded_bs)
        self.metadata = VerifyMetadataBuffers.allocate(
            padded_bs, max_pages=worker.context_len, device=dev
        )
        self.graph: Any = None  # torch.cuda.CUDAGraph once captured
        self.outputs: tuple[torch.Tensor, torch.Tensor] | None = None


class GraphRunner:
    """Runs TARGET_VERIFY for a worker through per-bucket static buffers.

    Raises :class:`~specstrat.errors.InvalidConfig` when ``is_draft_worker`` is set and the
    algorithm's policy refuses TARGET_VERIFY on the draft worker.
    """

    def __init__(
        self,
        worker: ModelWorker,
        algo: SpecAlgorithm[Any],
        num_draft_tokens: int,
        *,
        is_draft_worker: bool = False,
        buckets: Sequence[int] = (1, 2, 4, 8, 16),
        use_cuda_graph: bool | None = None,
    ) -> None:
        if is_draft_worker and not algo.supports_target_verify_for_draft():
            raise InvalidConfig(
                f"algorithm {algo.name} does not allow TARGET_VERIFY on the draft worker "
                "(its policy's supports_target_verify_for_draft() is False); build the draft "
                "worker without a verify graph runner, or use a policy that allows it"
            )
        if not buckets or any(
            isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in buckets
        ):
            raise InvalidConfig(f"buckets={tuple(buckets)} must be ints >= 1")
        self.worker = worker
        self.tokens_per_req = algo.get_num_tokens_per_req_for_target_verify(
            num_draft_tokens, is_draft_worker
        )
        self.use_cuda_graph = (
            worker.device.type == "cuda" if use_cuda_graph is None else use_cuda_graph
        )
        self._buckets = {b: _Bucket(b, self.tokens_per_req, worker) for b in sorted(set(buckets))}

    @property
    def buckets(self) -> tuple[int, ...]:
        """Captured batch sizes, ascending."""
        return tuple(self._buckets)

    def can_run(self, bs: int) -> bool:
        """Whether some bucket holds ``bs`` requests."""
        return 0 < bs <= max(self._buckets)

    def replay(
        self, slots: Sequence[int], tokens: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """TARGET_VERIFY of ``tokens [bs, T]`` for ``slots``; logits and hidden, ``bs * T`` rows."""
        bs, t = tokens.shape
        if t != self.tokens_per_req:
            raise InvalidConfig(
                f"tokens have width {t}; this runner verifies T={self.tokens_per_req}"
            )
        if not self.can_run(bs):
            raise InvalidConfig(f"bs={bs} exceeds the largest bucket {max(self._buckets)}")
        bucket = self._buckets[min(b for b in self._buckets if b >= bs)]
        prepared = self.worker.place(slots, tokens.tolist())
        n = bs * t
        dev = self.worker.device
        # Real rows first; padding rows: token 0 at position 0, KV slot 0, request row 0.
        bucket.input_ids.zero_()[:n].copy_(tokens.reshape(-1))
        bucket.positions.zero_()[:n].copy_(torch.tensor(prepared.positions, device=dev))
        bucket.out_cache_loc.zero_()[:n].copy_(torch.tensor(prepared.locations, device=dev))
        bucket.req_pool_indices.zero_()[:bs].copy_(torch.tensor(list(slots), device=dev))
        bucket.seq_lens.zero_()[:bs].copy_(torch.tensor(prepared.prefix, device=dev))
        meta = build_verify_metadata_into(
            bucket.metadata,
            bucket.seq_lens[:bs],
            t,
            req_pool_indices=bucket.req_pool_indices[:bs],
            req_to_token=self.worker.requests.req_to_token,
            seq_lens_cpu=prepared.prefix,
        )
        max_k = self.worker.context_len if self.use_cuda_graph else (meta.max_seq_len_k or t)

        def forward() -> tuple[torch.Tensor, torch.Tensor]:
            return self.worker.execute(
                ForwardMode.TARGET_VERIFY if t > 1 else ForwardMode.DECODE,
                input_ids=bucket.input_ids,
                positions=bucket.positions,
                out_cache_loc=bucket.out_cache_loc,
                metadata=meta,
                max_q=t,
                max_k=max_k,
            )

        logits, hidden = self._run(bucket, forward)
        return logits[:n], hidden[:n]

    def _run(
        self, bucket: _Bucket, forward: Callable[[], tuple[torch.Tensor, torch.Tensor]]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.use_cuda_graph:
            return forward()
        if bucket.graph is None:  # capture once per bucket, after a warm-up run
            forward()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                bucket.outputs = forward()
            bucket.graph = graph
        bucket.graph.replay()
        if bucket.outputs is None:
            raise KernelError(f"bucket {bucket.padded_bs} has a graph but no captured outputs")
        return bucket.outputs
