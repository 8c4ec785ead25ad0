# expect: assignment UndeclaredPolicy
# member: candidate_widths
from specstrat import SpeculationObservation, SpeculationPolicy, WidthChooser


class UndeclaredPolicy:
    per_request_acceptance = False

    def create_chooser(self, candidates: tuple[int, ...], num_draft_tokens: int) -> WidthChooser:
        return self

    def choose_width(self, observation: SpeculationObservation) -> int:
        return 4


POLICY: SpeculationPolicy = UndeclaredPolicy()
