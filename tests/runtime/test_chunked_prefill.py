"""Prefill packs the admitted prompts into forwards of at most chunked_prefill_size tokens, a
longer prompt in pieces: outputs equal one whole-prompt forward's, and no forward is larger."""

from typing import Any

import pytest

from specstrat.runtime import EmbeddedModels, Engine, EngineConfig, Request
from specstrat.runtime._forward import ForwardMode
from specstrat.runtime._worker import ModelWorker

PROMPTS = ("def add(a, b):\n    return a + b\n" * 3, "x = 1\n", "print('hello, world')\n" * 2)


def _requests() -> list[Request]:
    return [Request.from_text(f"r{i}", p, 12) for i, p in enumerate(PROMPTS)]


@pytest.mark.parametrize("algo", ["NONE", "EAGLE", "NGRAM"])
@pytest.mark.parametrize("size", [1, 7, 40])
def test_chunked_prefill_gives_the_same_tokens_with_bounded_forwards(
    algo: str, size: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Greedy outputs with chunked_prefill_size 1, 7 and 40 equal those of one prefill forward
    of every prompt, and each prefill forward holds at most that many tokens."""
    models = EmbeddedModels.load()
    whole = max(len(r.prompt) for r in _requests()) * len(PROMPTS)
    want = Engine(algo, models, EngineConfig(chunked_prefill_size=whole)).run(_requests())
    sizes: list[int] = []
    real = ModelWorker.forward

    def spy(self: ModelWorker, mode: ForwardMode, slots: Any, tokens: Any, **kw: Any) -> Any:
        if mode is ForwardMode.EXTEND and self.shape == models.target.shape:
            sizes.append(sum(len(t) for t in tokens))
        return real(self, mode, slots, tokens, **kw)

    monkeypatch.setattr(ModelWorker, "forward", spy)
    got = Engine(algo, models, EngineConfig(chunked_prefill_size=size)).run(_requests())
    assert got == want
    assert sizes
    assert max(sizes) <= size
    assert sum(sizes) == sum(len(r.prompt) for r in _requests())
