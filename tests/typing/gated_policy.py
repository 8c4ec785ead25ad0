"""Your own speculation policy: draft while the first guess is accepted often enough, else
decode plainly, probing every 8th step (an acceptance-rate gate, as TensorRT-LLM has)."""

from dataclasses import dataclass, replace

from specstrat import NGRAM, SpeculationObservation, SpeculationPolicy, WidthChooser


@dataclass(frozen=True)
class GatedPolicy:
    threshold: float = 0.3  # acceptance of draft position 1 below this: stop drafting
    per_request_acceptance = False  # it reads the global acceptance only

    def candidate_widths(self, num_draft_tokens: int) -> tuple[int, ...]:
        return tuple(sorted({1, num_draft_tokens}))

    def create_chooser(self, candidates: tuple[int, ...], num_draft_tokens: int) -> WidthChooser:
        return self  # no state of its own: the observation carries what it needs

    def choose_width(self, observation: SpeculationObservation) -> int:
        first = observation.acceptance[0] if observation.acceptance else None
        if first is None or first >= self.threshold or observation.step % 8 == 0:
            return observation.candidates[-1]
        return 1


GATED: SpeculationPolicy = GatedPolicy()
GATED_NGRAM = replace(NGRAM, name="GATED_NGRAM", speculation=GATED)
