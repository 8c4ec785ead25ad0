# expect: assignment UndeclaredPolicy
from specstrat import SpeculationObservation, SpeculationPolicy


class UndeclaredPolicy:
    per_request_acceptance = False

    def create_chooser(self, candidates: tuple[int, ...], num_draft_tokens: int) -> "UndeclaredPolicy":
        return self

    def choose_width(self, observation: SpeculationObservation) -> int:
        return 4


POLICY: SpeculationPolicy = UndeclaredPolicy()
