"""Triton kernels for TARGET_VERIFY metadata (uniform, graph, ragged and tree) and the relay
gather, each with its torch twin.

Dispatch: the Triton kernel for CUDA tensors when triton imports, the twin otherwise; every
launcher takes ``backend="auto" | "triton" | "torch"`` to override. The package imports and works
where triton is absent. The metadata builders take the batch's page-table inputs as one
:class:`Paging` value (``paging=``), or ``None`` for no page table.
"""

from specstrat.kernels._triton import HAS_TRITON, INTERPRETED, Backend
from specstrat.kernels.relay_gather import gather_relay, gather_relay_ref
from specstrat.kernels.tree_metadata import (
    TreeVerifyMetadata,
    TreeVerifyMetadataBuffers,
    build_tree_verify_metadata,
    build_tree_verify_metadata_into,
    tree_verify_metadata_ref,
)
from specstrat.kernels.verify_metadata import (
    PAD_PAGE,
    PAD_SEQ_LEN,
    Paging,
    VerifyMetadata,
    VerifyMetadataBuffers,
    build_ragged_verify_metadata,
    build_ragged_verify_metadata_into,
    build_verify_metadata,
    build_verify_metadata_into,
    verify_metadata_ref,
)

__all__ = [
    "HAS_TRITON",
    "INTERPRETED",
    "PAD_PAGE",
    "PAD_SEQ_LEN",
    "Backend",
    "Paging",
    "TreeVerifyMetadata",
    "TreeVerifyMetadataBuffers",
    "VerifyMetadata",
    "VerifyMetadataBuffers",
    "build_ragged_verify_metadata",
    "build_tree_verify_metadata",
    "build_tree_verify_metadata_into",
    "build_ragged_verify_metadata_into",
    "build_verify_metadata",
    "build_verify_metadata_into",
    "gather_relay",
    "gather_relay_ref",
    "tree_verify_metadata_ref",
    "verify_metadata_ref",
]
