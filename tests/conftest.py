"""Test set-up: Triton kernel bodies run on the CPU interpreter; hypothesis profiles dev and ci."""

import os

# Triton reads this when a kernel is decorated: it must be set before specstrat.kernels imports.
os.environ.setdefault("TRITON_INTERPRET", "1")

# Under pytest-xdist (`make test` runs one worker per logical CPU) each worker and the commands it
# starts take one thread: two workers of two threads each on two cores ran the slow suite
# slower than one process did.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch

    torch.set_num_threads(1)

from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    max_examples=300,
    derandomize=True,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "dev",
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

#: Spec-Bench's questions, read where the workspace keeps them (never copied into the project).
SPEC_BENCH = Path(__file__).resolve().parents[1].parent / "shared/data/spec_bench/question.jsonl"

#: For tests that read Spec-Bench: a checkout without the shared data beside it skips them.
needs_spec_bench = pytest.mark.skipif(
    not SPEC_BENCH.is_file(), reason=f"Spec-Bench questions not found at {SPEC_BENCH}"
)
