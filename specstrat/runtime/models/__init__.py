"""The embedded byte models: definitions, shipped weights, text encoding and training."""

from specstrat.runtime.models.model import BoundEagleHead, EagleHead, ModelConfig, TinyLM
from specstrat.runtime.models.weights import EMBEDDED_WEIGHTS, EmbeddedModels

__all__ = [
    "EMBEDDED_WEIGHTS",
    "BoundEagleHead",
    "EagleHead",
    "EmbeddedModels",
    "ModelConfig",
    "TinyLM",
]
