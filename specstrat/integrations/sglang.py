"""Run a specstrat algorithm inside SGLang 0.5.23: registration, plugin, parity check.

::

    from specstrat.integrations.sglang import register
    register(MY_EAGLE, worker=MyEagleWorker)  # --speculative-algorithm MY_EAGLE

:func:`register` puts the algorithm into SGLang's registry through
``SpeculativeAlgorithm.register``, with a generated ``CustomSpecAlgo`` subclass whose hooks
answer from the algorithm's strategies and capabilities, including the four SGLang's base class
lacks (``create_future_map``, ``need_topk``, ``carries_draft_hidden_states``,
``get_platform_worker_cls``). :func:`plugin` makes the callable for SGLang's
``sglang.srt.plugins`` entry-point group. :func:`check_sglang` (``specstrat check --sglang
MODULE:ATTR``) checks method-set and hook-answer parity.

SGLang is imported on first use; without it every function raises :class:`IntegrationError`
saying how to install it. SGLang still decides some paths by identity (``is_eagle()``, the
algorithm's name): docs/guides/sglang.md lists what the worker must do.
"""

from __future__ import annotations

from specstrat.integrations._sglang_adapter import SGLangBinding as SGLangBinding
from specstrat.integrations._sglang_adapter import SpecstratSpecAlgo as SpecstratSpecAlgo
from specstrat.integrations._sglang_adapter import ToSpecInput as ToSpecInput
from specstrat.integrations._sglang_adapter import builtin_spec_input as builtin_spec_input
from specstrat.integrations._sglang_adapter import (
    prebuilt_batch_from_schedule_batch as prebuilt_batch_from_schedule_batch,
)
from specstrat.integrations._sglang_check import CHECKED_DRAFT_TOKENS as CHECKED_DRAFT_TOKENS
from specstrat.integrations._sglang_check import SGLangCheck as SGLangCheck
from specstrat.integrations._sglang_check import SGLangReport as SGLangReport
from specstrat.integrations._sglang_check import check_sglang as check_sglang
from specstrat.integrations._sglang_check import enum_methods as enum_methods
from specstrat.integrations._sglang_import import SGLANG_VERSION as SGLANG_VERSION
from specstrat.integrations._sglang_import import IntegrationError as IntegrationError
from specstrat.integrations._sglang_import import load_sglang as load_sglang
from specstrat.integrations._sglang_registry import SGLangPlugin as SGLangPlugin
from specstrat.integrations._sglang_registry import Worker as Worker
from specstrat.integrations._sglang_registry import plugin as plugin
from specstrat.integrations._sglang_registry import register as register
from specstrat.integrations._sglang_registry import registered as registered
from specstrat.integrations._sglang_registry import unregister as unregister

__all__ = [
    "CHECKED_DRAFT_TOKENS",
    "SGLANG_VERSION",
    "IntegrationError",
    "SGLangBinding",
    "SGLangCheck",
    "SGLangPlugin",
    "SGLangReport",
    "SpecstratSpecAlgo",
    "ToSpecInput",
    "Worker",
    "builtin_spec_input",
    "check_sglang",
    "enum_methods",
    "load_sglang",
    "plugin",
    "prebuilt_batch_from_schedule_batch",
    "register",
    "registered",
    "unregister",
]
