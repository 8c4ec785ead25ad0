"""check_lossless_in_distribution on Hugging Face models: it passes the built-in rejection
sampler and catches biased rules on a tiny model, bounds its exact rows by ``joint_bytes``
(refusing by name what that cannot test), and runs at a 49152-entry vocabulary within 2 GB."""

import copy
import os
import resource
from dataclasses import replace
from typing import Any

import pytest
import torch

import specstrat
from specstrat import ConformanceError, InvalidConfig, ModelSet
from specstrat.hf import HFCausalLM
from specstrat.testing import LosslessReport, check_lossless_in_distribution
from tests.hf import tiny
from tests.runtime.biased import ACCEPT_ALL, NO_RESIDUAL

ROW = 8 * tiny.VOCAB  # bytes of one exact float64 second-token row


@pytest.fixture(scope="module")
def models() -> ModelSet:
    """A 3-layer llama target and, as draft, a copy with every weight matrix perturbed by 0.3 of
    its standard deviation (drafts are often rejected, so the residual is exercised)."""
    target = tiny.model("llama", num_hidden_layers=3)
    draft = copy.deepcopy(target)
    torch.manual_seed(5)
    with torch.no_grad():
        for p in draft.parameters():
            if p.dim() > 1:
                p.add_(0.3 * p.std() * torch.randn_like(p))
    return ModelSet(
        target=HFCausalLM(target, vocab_size=tiny.VOCAB, name="target"),
        draft=HFCausalLM(draft, vocab_size=tiny.VOCAB, name="draft"),
    )


def check(models: ModelSet, prompt: tuple[int, ...], **kw: Any) -> LosslessReport:
    """The check at temperature 1 on 2000 samples of STANDALONE (or ``algo``)."""
    algo = kw.pop("algo", specstrat.STANDALONE)
    return check_lossless_in_distribution(
        algo, temperature=1.0, num_samples=2000, models=models, prompt=prompt, **kw
    )


@pytest.fixture(scope="module")
def full(models: ModelSet, ids: tuple[int, ...]) -> LosslessReport:
    """The built-in STANDALONE through the check, every first token computed exactly."""
    return check(models, ids[:10])


def test_the_rejection_sampler_passes_on_a_tiny_hf_model(full: LosslessReport) -> None:
    """STANDALONE's rejection sampling keeps the target's distribution of the first two tokens,
    with every first token's second-token row computed exactly (vocabulary 384)."""
    assert full.p_value >= full.significance
    assert full.exact_first_tokens == tiny.VOCAB
    assert full.dof > 20  # the test has bins to speak of


@pytest.mark.parametrize(
    "rule", [ACCEPT_ALL, NO_RESIDUAL], ids=["accepts-every-draft", "never-uses-the-residual"]
)
def test_biased_rules_fail_on_a_tiny_hf_model(
    rule: Any, models: ModelSet, ids: tuple[int, ...]
) -> None:
    """A rule that accepts every draft, or samples p instead of the residual, fails the check."""
    algo = replace(specstrat.STANDALONE, name="BIASED", acceptance=rule)
    with pytest.raises(ConformanceError, match=r"BIASED is not lossless in distribution .* p="):
        check(models, ids[:10], algo=algo)


def test_a_joint_bytes_budget_keeps_the_pair_test_exact(
    models: ModelSet, ids: tuple[int, ...], full: LosslessReport
) -> None:
    """With room for 40 exact rows (every first token expected 5 times is among them) the
    check computes 40 rows and gives the full run's pair statistic (the left-out first tokens'
    pairs were pooled anyway)."""
    report = check(models, ids[:10], joint_bytes=40 * ROW)
    assert report.exact_first_tokens == 40
    assert report.dof == full.dof
    # The pooled bin's expectation is summed in another order: measured 4e-16 relative (float64
    # rounding); 1e-12 leaves room. p is float32 (gammaincc): 1e-6 is about 8 float32 ulps.
    assert report.statistic == pytest.approx(full.statistic, rel=1e-12)
    assert report.p_value == pytest.approx(full.p_value, rel=1e-6)


def test_a_budget_that_drops_a_well_expected_first_token_is_refused(
    models: ModelSet, ids: tuple[int, ...]
) -> None:
    """Room for 20 rows when the 21st likeliest first token is expected 10 times: a named
    refusal saying what to change, never a weaker test."""
    with pytest.raises(
        InvalidConfig,
        match=r"num_samples=2000 expects first token \d+ 10\.0 times, but only the 20 likeliest "
        r"first tokens fit joint_bytes=61440 at vocab_size=384; lower num_samples or raise",
    ):
        check(models, ids[:10], joint_bytes=20 * ROW)


@pytest.mark.parametrize("bad", [ROW - 1, 0, True, 1.5e9])
def test_joint_bytes_below_one_row_is_refused(bad: Any, models: ModelSet) -> None:
    """joint_bytes must be an int holding at least one row of the vocabulary."""
    with pytest.raises(InvalidConfig, match=r"joint_bytes=.* must be an int >= 3072 \(one float64"):
        check(models, (1, 2, 3), joint_bytes=bad)


def _rss() -> int:
    """Resident bytes of this process now."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.slow
def test_the_check_runs_at_vocabulary_49152_within_2_gb() -> None:
    """At a 49152-entry vocabulary (where a dense joint would take 19 GB) the check computes the
    1365 likeliest first tokens' rows and passes NGRAM, its peak under 2 GiB above the start (an
    over-estimate: the peak may predate the check). Measured: 1.54 GiB, about 40 s on 2 cores."""
    lm = HFCausalLM(tiny.model("llama", vocab_size=49152, num_hidden_layers=1), name="v49152")
    before = _rss()
    report = check_lossless_in_distribution(
        specstrat.NGRAM,
        temperature=1.0,
        num_samples=100,
        models=ModelSet(target=lm),
        prompt=tuple(range(100, 112)),
    )
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kilobytes on Linux
    assert report.exact_first_tokens == 1365
    assert peak - before < 2 * 2**30
