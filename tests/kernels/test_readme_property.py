"""The three-line property test of docs/guides/checking.md, run as written."""

from hypothesis import given

from specstrat.testing import check_verify_metadata, verify_batches
from tests.typing.readme_example import ShortDraftVerifyPolicy


@given(verify_batches(policy=ShortDraftVerifyPolicy()))
def test_my_policy_metadata(batch):  # type: ignore[no-untyped-def]
    """Metadata built for any batch under the README example's policy keeps every invariant."""
    check_verify_metadata(batch.build(), batch)
