# expect: return-value WidthChooser
# member: choose_width
from specstrat import SpeculationObservation, SpeculationPolicy, WidthChooser


class HalfWidthPolicy:
    per_request_acceptance = False

    def candidate_widths(self, num_draft_tokens: int) -> tuple[int, ...]:
        return (1, num_draft_tokens)

    def create_chooser(self, candidates: tuple[int, ...], num_draft_tokens: int) -> WidthChooser:
        return self

    def choose_width(self, observation: SpeculationObservation) -> float:
        return observation.candidates[-1] / 2


POLICY: SpeculationPolicy = HalfWidthPolicy()
