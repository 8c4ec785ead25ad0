"""Hugging Face causal LMs in the engine (``pip install 'specstrat[hf]'``).

:func:`load` takes a model directory or a ``.gguf`` file (local files only) and returns
:class:`HFModels`, which :class:`~specstrat.runtime.Engine` runs like the embedded models;
:class:`HFCausalLM` wraps a model you built yourself. The engine's paged attention is plugged
into transformers' attention interface (no modelling code is copied); text and chat requests
are built with the model's tokenizer; :func:`compare` checks outputs against transformers' own
greedy ``generate`` (:func:`generate_reference`), certifying numerical ties. A plain
transformers Llama runs a forward of its own weights without transformers' per-layer module
calls where a probe at load proves it equal (:mod:`specstrat.hf.fast_llama`).
"""

from specstrat.hf.adapter import ATTENTION_NAME, HFCausalLM, paged_attention
from specstrat.hf.algorithms import EARLY_EXIT, NGRAM_RAGGED, early_exit_algorithm
from specstrat.hf.loader import HFModels, cache_dir, eos_token_ids, load
from specstrat.hf.process_loader import HFLoader
from specstrat.hf.reference import (
    TIE_EPSILON,
    ReferenceCheck,
    certified_tie,
    compare,
    generate_reference,
    generation_config,
    plain_defaults,
)
from specstrat.hf.text_io import chat_request, decode, stop_token_ids, text_request

__all__ = [
    "ATTENTION_NAME",
    "EARLY_EXIT",
    "NGRAM_RAGGED",
    "TIE_EPSILON",
    "HFCausalLM",
    "HFLoader",
    "HFModels",
    "ReferenceCheck",
    "cache_dir",
    "eos_token_ids",
    "certified_tie",
    "chat_request",
    "compare",
    "decode",
    "early_exit_algorithm",
    "generate_reference",
    "generation_config",
    "load",
    "paged_attention",
    "plain_defaults",
    "stop_token_ids",
    "text_request",
]
