"""The embedded byte models: definitions, shipped weights, text encoding and training."""

from specstrat.runtime._models.model import BoundEagleHead, EagleHead, ModelConfig, TinyLM
from specstrat.runtime._models.weights import EMBEDDED_WEIGHTS, EmbeddedModels

__all__ = [
    "EMBEDDED_WEIGHTS",
    "BoundEagleHead",
    "EagleHead",
    "EmbeddedModels",
    "ModelConfig",
    "TinyLM",
]
