"""Hugging Face causal LMs in the engine (``pip install 'specstrat[hf]'``).

:func:`load` takes a model directory or a ``.gguf`` file (local files only) and returns
:class:`HFModels`, which :class:`~specstrat.runtime.Engine` runs like the embedded models;
:class:`HFCausalLM` wraps a model you built yourself. The engine's paged attention is plugged
into transformers' attention interface (no modelling code is copied); text and chat requests
are built with the model's tokenizer; :func:`compare` checks outputs against transformers' own
greedy ``generate`` (:func:`generate_reference`), certifying numerical ties.
"""

from specstrat.hf.adapter import ATTENTION_NAME, HFCausalLM, paged_attention
from specstrat.hf.loader import HFModels, cache_dir, load
from specstrat.hf.reference import (
    TIE_EPSILON,
    ReferenceCheck,
    certified_tie,
    compare,
    generate_reference,
)
from specstrat.hf.text import chat_request, decode, stop_token_ids, text_request

__all__ = [
    "ATTENTION_NAME",
    "TIE_EPSILON",
    "HFCausalLM",
    "HFModels",
    "ReferenceCheck",
    "cache_dir",
    "certified_tie",
    "chat_request",
    "compare",
    "decode",
    "generate_reference",
    "load",
    "paged_attention",
    "stop_token_ids",
    "text_request",
]
