"""TARGET_VERIFY through static buffers per batch bucket, replayed with in-place metadata.

For each bucket ``padded_bs`` the runner owns static input buffers (``padded_bs * T`` tokens) and
static metadata buffers, with ``T = algo.get_num_tokens_per_req_for_target_verify(D,
is_draft_worker)``. A replay copies the real batch into the buffers (padding rows point at the
padding request row 0 and KV index 0), rebuilds the metadata in place
(:func:`~specstrat.kernels.build_verify_metadata_into`: one launch, no allocation, no host sync)
and runs the model on the static tensors. On CUDA the model forward is captured once per bucket
in a ``torch.cuda.CUDAGraph`` (keys bounded by ``context_len``) and replayed; on the CPU the same
static-buffer path runs eagerly.

Ragged steps (request ``i`` verifies ``1 <= counts[i] <= T`` tokens) replay from the same
buckets. Token buckets are the batch buckets times ``T`` (SGLang's rule for compact ragged
verify graphs): bucket ``B`` holds ``B`` rows and ``B * T`` tokens. A ragged batch of ``bs``
requests and ``S = sum(counts)`` tokens takes the smallest ``B >= bs`` with a padding row for
the ``B * T - S`` leftover tokens (``B > bs``, or ``S == B * T``); the metadata comes from
:func:`~specstrat.kernels.build_ragged_verify_metadata_into`, whose padding rows share the
leftover as SGLang's ``padded_to_bucket`` does. Padding tokens write KV index 0, like the uniform
form's. Each bucket captures a second CUDA graph for ragged replays: attention there is sized for
the widest padding row any batch can leave, ``B * (T - 1) + 1`` query rows.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from specstrat._ints import is_int
from specstrat.algorithm import SpecAlgorithm
from specstrat.errors import InvalidConfig, KernelError
from specstrat.kernels import (
    Paging,
    TreeVerifyMetadataBuffers,
    VerifyMetadata,
    VerifyMetadataBuffers,
    build_ragged_verify_metadata_into,
    build_tree_verify_metadata_into,
    build_verify_metadata_into,
)
from specstrat.runtime._forward import ForwardMode, TreeAttention
from specstrat.runtime._worker import ModelWorker, PreparedTokens

__all__ = ["GraphRunner"]


class _Bucket:
    def __init__(self, padded_bs: int, tokens: int, worker: ModelWorker) -> None:
        dev, n = worker.device, padded_bs * tokens

        def zeros(size: int) -> torch.Tensor:
            return torch.zeros(size, dtype=torch.int64, device=dev)

        self.padded_bs = padded_bs
        self.input_ids, self.positions, self.out_cache_loc = zeros(n), zeros(n), zeros(n)
        self.req_pool_indices, self.seq_lens = zeros(padded_bs), zeros(padded_bs)
        self.num_tokens_per_req = zeros(padded_bs)  # per-request tokens of a ragged replay
        self.metadata = VerifyMetadataBuffers.allocate(
            padded_bs, max_pages=worker.context_len, device=dev
        )
        # Keyed by replay shape ("uniform", "ragged", "tree"): each captures apart.
        self.graphs: dict[str, Any] = {}  # torch.cuda.CUDAGraph once captured
        self.outputs: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        self.tree: _TreeBuffers | None = None  # allocated at the first tree replay

    def load(self, slots: Sequence[int], ids: torch.Tensor, prepared: PreparedTokens) -> int:
        """Copy a batch placed by ``worker.place`` into the static inputs, real rows first;
        padding: token 0 at position 0, KV index 0, request row 0. Returns its token count."""
        n, bs, dev = ids.numel(), len(slots), self.input_ids.device
        self.input_ids.zero_()[:n].copy_(ids.reshape(-1))
        self.positions.zero_()[:n].copy_(prepared.positions)
        self.out_cache_loc.zero_()[:n].copy_(prepared.locations)
        self.req_pool_indices.zero_()[:bs].copy_(torch.tensor(list(slots), device=dev))
        self.seq_lens.zero_()[:bs].copy_(torch.tensor(prepared.prefix, device=dev))
        return n


class _TreeBuffers:
    """A bucket's static tree inputs and metadata (sharing the bucket's uniform buffers)."""

    def __init__(self, bucket: _Bucket, tokens: int) -> None:
        dev = bucket.seq_lens.device
        self.parents = torch.full((bucket.padded_bs, tokens - 1), -1, dtype=torch.int64, device=dev)
        self.lengths = torch.zeros(bucket.padded_bs, dtype=torch.int64, device=dev)
        self.metadata = TreeVerifyMetadataBuffers.uninitialized(bucket.metadata, tokens)
        self.metadata.tree_mask.zero_()
        self.metadata.positions.zero_()


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
        if not buckets or any(not is_int(b) or b < 1 for b in buckets):
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

    def _bucket_for(self, bs: int) -> _Bucket:
        """The smallest bucket holding ``bs`` requests."""
        if not self.can_run(bs):
            raise InvalidConfig(f"bs={bs} exceeds the largest bucket {max(self._buckets)}")
        return self._buckets[min(b for b in self._buckets if b >= bs)]

    def _paging(self, bucket: _Bucket, bs: int) -> Paging:
        """The page-table inputs of a replay: the bucket's first ``bs`` pool rows of the
        worker's request-to-token table (page size 1)."""
        return Paging(
            req_pool_indices=bucket.req_pool_indices[:bs],
            req_to_token=self.worker.requests.req_to_token,
        )

    def replay(
        self, slots: Sequence[int], tokens: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """TARGET_VERIFY of ``tokens [bs, T]`` for ``slots``; logits and hidden, ``bs * T`` rows."""
        bs, t = tokens.shape
        if t != self.tokens_per_req:
            raise InvalidConfig(
                f"tokens have {t} per request; this runner verifies T={self.tokens_per_req}"
            )
        bucket = self._bucket_for(bs)
        prepared = self.worker.place(slots, [t] * bs)
        n = bucket.load(slots, tokens, prepared)
        meta = build_verify_metadata_into(
            bucket.metadata,
            bucket.seq_lens[:bs],
            tokens_per_req=t,
            paging=self._paging(bucket, bs),
            seq_lens_cpu=prepared.prefix,
        )
        max_k = self.worker.context_len if self.use_cuda_graph else (meta.max_seq_len_k or t)
        mode = ForwardMode.TARGET_VERIFY if t > 1 else ForwardMode.DECODE
        logits, hidden = self._replay(bucket, "uniform", mode, meta, t, max_k)
        return logits[:n], hidden[:n]

    def replay_tree(
        self,
        slots: Sequence[int],
        tokens: torch.Tensor,
        parents: torch.Tensor,
        lengths: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Tree TARGET_VERIFY of ``tokens [bs, T]`` (the root, then the nodes of a draft tree
        with ``parents [bs, T - 1]`` and ``lengths [bs]``): positions ``seq_len + depth`` and
        tree masks from :func:`~specstrat.kernels.build_tree_verify_metadata_into` (one launch,
        no host sync). Logits and hidden, ``bs * T`` rows."""
        bs, t = tokens.shape
        if t != self.tokens_per_req or tuple(parents.shape) != (bs, t - 1):
            raise InvalidConfig(
                f"tree tokens {tuple(tokens.shape)} and parents {tuple(parents.shape)}; this "
                f"runner verifies T={self.tokens_per_req} (parents [bs, T - 1])"
            )
        bucket = self._bucket_for(bs)
        tree = bucket.tree = bucket.tree or _TreeBuffers(bucket, t)
        prepared = self.worker.place(slots, [t] * bs)
        n = bucket.load(slots, tokens, prepared)
        tree.parents.fill_(-1)[:bs].copy_(parents)
        tree.lengths.zero_()[:bs].copy_(lengths)
        meta = build_tree_verify_metadata_into(
            tree.metadata,
            tree.parents[:bs],
            tree.lengths[:bs],
            bucket.seq_lens[:bs],
            paging=self._paging(bucket, bs),
            seq_lens_cpu=prepared.prefix,
        )
        base = meta.base
        max_k = self.worker.context_len if self.use_cuda_graph else (base.max_seq_len_k or t)
        attention = TreeAttention(start=bucket.seq_lens, mask=meta.tree_mask)
        logits, hidden = self._replay(
            bucket, "tree", ForwardMode.TARGET_VERIFY, base, t, max_k, meta.positions, attention
        )
        return logits[:n], hidden[:n]

    def ragged_bucket(self, bs: int, total_tokens: int) -> int | None:
        """The batch bucket a ragged step of ``bs`` requests and ``total_tokens`` tokens replays
        from (it has ``bucket * T`` tokens), or ``None`` when none fits."""
        t = self.tokens_per_req
        if bs < 1 or not bs <= total_tokens <= bs * t:
            return None
        for b in self._buckets:
            if b > bs or (b == bs and total_tokens == b * t):
                return b
        return None

    def can_run_ragged(self, bs: int, total_tokens: int) -> bool:
        """Whether a ragged step of ``bs`` requests (``1..T`` tokens each) and ``total_tokens``
        tokens fits a bucket (see the module docstring for the rule)."""
        return self.ragged_bucket(bs, total_tokens) is not None

    @property
    def ragged_buckets(self) -> tuple[tuple[int, int], ...]:
        """``(padded_bs, padded_tokens)`` of every bucket: ``(B, B * T)``, ascending."""
        return tuple((b, b * self.tokens_per_req) for b in self._buckets)

    def replay_ragged(
        self, slots: Sequence[int], tokens: Sequence[Sequence[int]]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Ragged TARGET_VERIFY: ``tokens[i]`` (``1..T`` tokens) after request ``slots[i]``.

        Returns logits ``[sum(counts), V]`` and hidden ``[sum(counts), H]``, the real tokens in
        order, as the eager ``worker.forward(ForwardMode.TARGET_VERIFY, slots, tokens)`` does.
        Raises :class:`~specstrat.errors.InvalidConfig` (before anything is placed) when a
        count is outside ``1..T`` or no bucket fits (check :meth:`can_run_ragged` first).
        """
        counts = [len(row) for row in tokens]
        t = self.tokens_per_req
        if len(counts) != len(slots):
            raise InvalidConfig(f"{len(slots)} slots but {len(counts)} token rows; pass one each")
        if (bad := next((c for c in counts if not 1 <= c <= t), None)) is not None:
            raise InvalidConfig(
                f"a ragged row has {bad} tokens; each verifies 1..T={t} (the runner's tokens "
                "per request)"
            )
        bs, total = len(counts), sum(counts)
        size = self.ragged_bucket(bs, total)
        if size is None:
            raise InvalidConfig(
                f"no bucket holds a ragged step of bs={bs} and {total} tokens (buckets "
                f"{self.ragged_buckets}); run it eagerly or add a bucket > {bs}"
            )
        bucket = self._buckets[size]
        prepared = self.worker.place(slots, [len(row) for row in tokens])
        dev = self.worker.device
        flat = torch.tensor([tok for row in tokens for tok in row], device=dev)
        bucket.load(slots, flat, prepared)
        bucket.num_tokens_per_req.zero_()[:bs].copy_(torch.tensor(counts, device=dev))
        meta = build_ragged_verify_metadata_into(
            bucket.metadata,
            bucket.seq_lens[:bs],
            bucket.num_tokens_per_req[:bs],
            padded_tokens=size * t,
            paging=self._paging(bucket, bs),
            seq_lens_cpu=prepared.prefix,
            num_tokens_per_req_cpu=counts,
        )
        if self.use_cuda_graph:  # captured once: bounds for any batch this bucket takes
            max_q, max_k = size * (t - 1) + 1, self.worker.context_len
        else:
            max_q, max_k = meta.max_seq_len_q or t, meta.max_seq_len_k or t

        logits, hidden = self._replay(
            bucket, "ragged", ForwardMode.TARGET_VERIFY, meta, max_q, max_k
        )
        return logits[:total], hidden[:total]

    def _replay(
        self,
        bucket: _Bucket,
        shape: str,
        mode: ForwardMode,
        meta: VerifyMetadata,
        max_q: int,
        max_k: int,
        positions: torch.Tensor | None = None,
        tree: TreeAttention | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The model over the bucket's static inputs (``positions`` overriding its own), run or
        replayed as the ``shape`` graph of this bucket."""

        def forward() -> tuple[torch.Tensor, torch.Tensor]:
            return self.worker.execute(
                mode,
                input_ids=bucket.input_ids,
                positions=bucket.positions if positions is None else positions,
                out_cache_loc=bucket.out_cache_loc,
                metadata=meta,
                max_q=max_q,
                max_k=max_k,
                tree=tree,
            )

        return self._run(bucket, forward, shape)

    def _run(
        self,
        bucket: _Bucket,
        forward: Callable[[], tuple[torch.Tensor, torch.Tensor]],
        shape: str,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.use_cuda_graph:
            return forward()
        if shape not in bucket.graphs:  # capture once per bucket and shape, after a warm-up
            forward()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                bucket.outputs[shape] = forward()
            bucket.graphs[shape] = graph
        bucket.graphs[shape].replay()
        if shape not in bucket.outputs:
            raise KernelError(f"bucket {bucket.padded_bs} has a graph but no captured outputs")
        return bucket.outputs[shape]
