"""Drafters in order: prompt lookup first, EAGLE's head for the requests the lookup missed."""

from dataclasses import replace

import specstrat
from specstrat import EAGLE, SpecAlgorithm
from specstrat.strategies import (
    EagleDraftInput,
    EagleHeadDrafterFactory,
    FirstMatch,
    NgramDrafterFactory,
)

LOOKUP_THEN_HEAD: SpecAlgorithm[EagleDraftInput] = specstrat.register(
    replace(
        EAGLE,
        name="LOOKUP_THEN_HEAD",
        drafter=FirstMatch((NgramDrafterFactory(), EagleHeadDrafterFactory())),
    )
)
