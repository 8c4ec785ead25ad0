"""Every error specstrat raises, in one tree.

```
SpecstratError
├── InvalidConfig        (also ValueError)  bad value: num_tokens, slots, widths, names, ...
│   ├── RegistrationError                   duplicate or reserved algorithm name
│   └── ModelLoadError                      a model path, id or config specstrat cannot load or run
├── InvalidStrategy      (also TypeError)   a strategy does not satisfy its hook's Protocol
├── UnknownAlgorithm     (also KeyError)    registry lookup of a name nobody registered
├── PluginLoadError      (also ImportError) an entry-point plugin failed to load
├── IntegrationError     (also ImportError) an engine integration cannot load its engine
├── KernelError          (also RuntimeError) a Triton/CUDA launch failed at the launcher boundary
├── DisaggError          (also RuntimeError) the decode side cannot rebuild draft state
├── StrategyError        (also RuntimeError) a strategy hook raised or broke its contract mid-run
│   └── RelayError                          a relay write or read disagrees with its buffers
├── ModelShapeError      (also RuntimeError) a model's outputs disagree with its ModelShape
├── EngineStateError     (also RuntimeError) the engine refuses a call in its current state
├── CapacityError        (also RuntimeError) request slots or KV ran out mid-run
├── InternalError        (also RuntimeError) an invariant of specstrat itself broke (a bug)
└── ConformanceError     (also AssertionError) a strategy broke an obligation of its hook
```

``InvalidConfig`` is only for values a caller passed. What goes wrong while a run is under way
has its own class: a hook's answer (``StrategyError``), a model's output (``ModelShapeError``),
a pool that admission should have kept from running out (``CapacityError``), or specstrat's
own bookkeeping (``InternalError``).

Messages show ``name=value`` and the fix, e.g.
``num_tokens=10 is not a multiple of bs=4; pass bs * tokens_per_req tokens``.
Subclassing the builtin exceptions keeps plain ``except ValueError`` working.
"""

from __future__ import annotations

__all__ = [
    "CapacityError",
    "ConformanceError",
    "DisaggError",
    "EngineStateError",
    "IntegrationError",
    "InternalError",
    "InvalidConfig",
    "InvalidStrategy",
    "KernelError",
    "ModelLoadError",
    "ModelShapeError",
    "PluginLoadError",
    "RegistrationError",
    "RelayError",
    "SpecstratError",
    "StrategyError",
    "UnknownAlgorithm",
]


class SpecstratError(Exception):
    """Root of every error specstrat raises."""


class InvalidConfig(SpecstratError, ValueError):
    """A value passed to specstrat is out of its domain; the message names it and the fix."""


class RegistrationError(InvalidConfig):
    """An algorithm could not be registered (duplicate or reserved name); the registry is
    unchanged."""


class ModelLoadError(InvalidConfig):
    """A model cannot be loaded or run: a missing path, a hub id (specstrat loads local files
    only), a missing optional package, or a config field the engine's attention cannot honour."""


class InvalidStrategy(SpecstratError, TypeError):
    """A strategy object does not satisfy the Protocol of the hook it was given for."""


class UnknownAlgorithm(SpecstratError, KeyError):
    """No algorithm is registered under the requested name; the message lists the known ones."""

    def __str__(self) -> str:
        # KeyError.__str__ repr-quotes its argument; show the message as written.
        return str(self.args[0]) if self.args else ""


class PluginLoadError(SpecstratError, ImportError):
    """An entry point in the ``specstrat.algorithms`` group failed to load or is not an
    algorithm."""


class IntegrationError(SpecstratError, ImportError):
    """An engine integration cannot load its engine: not installed, or a module failed."""


class KernelError(SpecstratError, RuntimeError):
    """A kernel launch failed, or the requested backend cannot run on these tensors."""


class DisaggError(SpecstratError, RuntimeError):
    """The decode side of disaggregation cannot rebuild draft state for some requests."""


class ConformanceError(SpecstratError, AssertionError):
    """A strategy broke an obligation of its hook; the message names the obligation."""


class StrategyError(SpecstratError, RuntimeError):
    """A strategy hook raised, or returned something that breaks its contract, during a run.

    The message names the algorithm, the hook and the method (``EAGLE.drafter.propose``); the
    original exception is chained as ``__cause__``.
    """


class RelayError(StrategyError):
    """A relay (FutureMap) write or read disagrees with its buffers: a field of another width or
    dtype, slots out of range, a ring entry that is missing or would be overwritten.

    ``field``: the relay field at fault (``None``: the slots themselves); ``writer``: the hook
    that wrote the refused value (``"drafter.commit"``, ...), set when the engine blames a
    writer (``None``: the relay's own call is at fault); ``algorithm``: the algorithm whose
    relay it is, set when the engine reports it (a relay raising it leaves it ``None``).
    """

    def __init__(
        self,
        message: str,
        *,
        field: str | None = None,
        writer: str | None = None,
        algorithm: str | None = None,
    ) -> None:
        super().__init__(message)
        self.field, self.writer, self.algorithm = field, writer, algorithm


class EngineStateError(SpecstratError, RuntimeError):
    """The engine refuses the call in its current state: a run is already in progress on
    another thread, or an earlier run failed and the engine was closed (create a new one)."""


class ModelShapeError(SpecstratError, RuntimeError):
    """A model's outputs disagree with its declared :class:`~specstrat.models.ModelShape`
    (logits wider or narrower than ``vocab_size``, hidden states not ``hidden_size`` wide),
    found at the model's first forward; the message names the model, the width and the fix."""


class CapacityError(SpecstratError, RuntimeError):
    """A request pool or KV pool ran out mid-run.

    Admission reserves every request's slots and KV before it starts, so this names a pool
    that a drafter or a custom scheduler used beyond its reservation; nothing the caller passed
    is wrong, so it is not an :class:`InvalidConfig`.
    """


class InternalError(SpecstratError, RuntimeError):
    """An invariant of specstrat's own bookkeeping broke: a bug in specstrat, not in the
    caller's values or strategies; the message says which invariant (please report it)."""
