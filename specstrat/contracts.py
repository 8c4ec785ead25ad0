"""What a hook's answer must satisfy before anything uses it: the contract, not the values.

The engine runs these on every answer of a drafter, an acceptance rule and a relay, and the
conformance kit (:mod:`specstrat.testing`) runs them on a user's strategy. Each check raises
:class:`~specstrat.errors.StrategyError` naming the algorithm, the hook and what was wrong; the
checks are vectorised over the batch.
"""

from __future__ import annotations

import torch

from specstrat.drafting import Acceptance, DraftTree
from specstrat.errors import StrategyError
from specstrat.relay import RelayPayload

__all__ = ["check_acceptance", "check_drafts", "check_payload", "describe", "hook_error"]


def describe(value: object) -> str:
    """A tensor's dtype and shape, or any other value's type name (for error messages)."""
    if isinstance(value, torch.Tensor):
        return f"{value.dtype} {tuple(value.shape)}"
    return type(value).__name__


def hook_error(algorithm: str, hook: str, problem: str) -> StrategyError:
    """A StrategyError for ``algorithm.hook`` (e.g. ``EAGLE.drafter.propose``)."""
    return StrategyError(f"{algorithm}.{hook}: {problem}")


def check_payload(algorithm: str, hook: str, payload: object, bs: int) -> None:
    """``payload`` is a RelayPayload with one row per request (or no field at all)."""
    if not isinstance(payload, RelayPayload):
        raise hook_error(
            algorithm,
            hook,
            f"returned {type(payload).__name__}, not a RelayPayload "
            "(return RelayPayload() to relay nothing)",
        )
    if payload.present() and payload.num_rows != bs:
        raise hook_error(
            algorithm, hook, f"returned a payload of {payload.num_rows} rows for {bs} requests"
        )


def _check_q(algorithm: str, hook: str, drafts: DraftTree) -> None:
    """``q`` of every real node is a distribution that gives the node's token some mass."""
    assert drafts.q is not None
    real = torch.arange(drafts.num_nodes)[None, :] < drafts.lengths.cpu()[:, None]
    q = drafts.q[real].to(torch.float64)
    if not bool(torch.isfinite(q).all()) or bool((q < 0).any()):
        raise hook_error(algorithm, hook, "q holds negative, NaN or infinite probabilities")
    sums = q.sum(-1)
    if bool(((sums - 1).abs() > 1e-3).any()):
        raise hook_error(
            algorithm, hook, f"q rows sum to {sums.min().item():.4g}..{sums.max().item():.4g}; "
            "each real node's q must be a probability distribution (sum 1)"
        )  # fmt: skip
    at_token = q.gather(1, drafts.tokens[real][:, None]).squeeze(1)
    if bool((at_token <= 0).any()):
        raise hook_error(
            algorithm, hook, "q gives a drafted token no probability: q must be the "
            "distribution the token was drawn from"
        )  # fmt: skip


def _out_of_vocab(tokens: torch.Tensor, vocab: int) -> list[int]:
    bad = (tokens < 0) | (tokens >= vocab)
    return tokens[bad].tolist()[:5]


def check_drafts(
    algorithm: str,
    drafts: object,
    bs: int,
    max_nodes: int,
    vocab: int,
    device: torch.device | None = None,
) -> None:
    """``drafts`` is a DraftTree of ``bs`` rows, at most ``max_nodes`` nodes, tokens (and ``q``'s
    last dimension) in the vocabulary, on ``device`` when one is given."""
    hook = "drafter.propose"
    if not isinstance(drafts, DraftTree):
        raise hook_error(algorithm, hook, f"returned {type(drafts).__name__}, not a DraftTree")
    if device is not None and drafts.tokens.device != device:
        raise hook_error(
            algorithm, hook, f"proposed a tree on {drafts.tokens.device}; the engine runs on "
            f"{device}: put its tensors there"
        )  # fmt: skip
    if drafts.q is not None and drafts.q.shape[2] != vocab:
        raise hook_error(
            algorithm, hook, f"q has {drafts.q.shape[2]} columns; the target's vocabulary has "
            f"{vocab}"
        )  # fmt: skip
    if drafts.q is not None and drafts.q.device.type == "cpu":
        _check_q(algorithm, hook, drafts)
    if drafts.bs != bs:
        raise hook_error(algorithm, hook, f"proposed {drafts.bs} rows for {bs} requests")
    if drafts.num_nodes > max_nodes:
        raise hook_error(
            algorithm,
            hook,
            f"proposed {drafts.num_nodes} nodes per request; the target "
            f"verifies at most max_nodes={max_nodes} (T - 1)",
        )
    bad = _out_of_vocab(drafts.tokens, vocab)
    if bad:
        raise hook_error(
            algorithm, hook, f"proposed token ids {bad} outside the vocabulary 0..{vocab - 1}"
        )


def check_acceptance(algorithm: str, acceptance: object, drafts: DraftTree, vocab: int) -> None:
    """``acceptance`` holds, per request, a root-to-node path within the real nodes of
    ``drafts`` and a bonus token in the vocabulary."""
    hook = "acceptance.accept"
    if not isinstance(acceptance, Acceptance):
        raise hook_error(
            algorithm, hook, f"returned {type(acceptance).__name__}, not an Acceptance"
        )
    bs, n = drafts.bs, drafts.num_nodes
    shapes = {
        "accept_index": (acceptance.accept_index, (bs, n)),
        "accept_lengths": (acceptance.accept_lengths, (bs,)),
        "bonus_tokens": (acceptance.bonus_tokens, (bs,)),
    }
    for name, (tensor, shape) in shapes.items():
        if (
            not isinstance(tensor, torch.Tensor)
            or tensor.dtype != torch.int64
            or tuple(tensor.shape) != shape
        ):
            got = describe(tensor)
            raise hook_error(algorithm, hook, f"{name} is {got}; expected torch.int64 {shape}")
    lengths, index = acceptance.accept_lengths.cpu(), acceptance.accept_index.cpu()
    real = drafts.lengths.cpu()
    too_long = (lengths < 0) | (lengths > real)
    if bool(too_long.any()):
        row = int(too_long.nonzero()[0])
        raise hook_error(
            algorithm,
            hook,
            f"request {row} accepted {int(lengths[row])} drafts but {int(real[row])} were proposed",
        )
    on_path = torch.arange(n)[None, :] < lengths[:, None]
    beyond = (index < -1) | (index >= n)
    if bool(beyond.any()):
        row = int(beyond.any(dim=1).nonzero()[0])
        raise hook_error(
            algorithm, hook, f"request {row}: accept_index={index[row].tolist()} holds node "
            f"indices outside -1..{n - 1}"
        )  # fmt: skip
    parents = drafts.parents.cpu().gather(1, index.clamp(min=0))
    previous = torch.cat([torch.full((bs, 1), -1, dtype=torch.int64), index[:, :-1]], dim=1)
    off_tree = on_path & ((index < 0) | (index >= real[:, None]) | (parents != previous))
    padded = ~on_path & (index != -1)
    if bool((off_tree | padded).any()):
        row = int((off_tree | padded).any(dim=1).nonzero()[0])
        raise hook_error(
            algorithm,
            hook,
            f"request {row}: accept_index={index[row].tolist()} with "
            f"accept_lengths={int(lengths[row])} is not a root-to-node path of the draft tree "
            f"(parents={drafts.parents[row].tolist()}, real nodes={int(real[row])}; -1 after "
            "the path)",
        )
    bad = _out_of_vocab(acceptance.bonus_tokens, vocab)
    if bad:
        raise hook_error(
            algorithm, hook, f"bonus tokens {bad} outside the vocabulary 0..{vocab - 1}"
        )
