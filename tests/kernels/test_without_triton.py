"""Where triton is absent the package still imports, builds metadata and gathers relays."""

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import sys
    sys.modules["triton"] = None  # makes `import triton` raise ImportError
    import torch
    import specstrat
    from specstrat.kernels import HAS_TRITON, build_verify_metadata, gather_relay
    from specstrat import KernelError, RelayPayload
    from specstrat.testing import check_algorithm
    assert not HAS_TRITON
    meta = build_verify_metadata(torch.tensor([3, 5]), num_tokens=4)
    assert meta.cu_seqlens_q.tolist() == [0, 2, 4]
    got = gather_relay(RelayPayload(bonus_tokens=torch.arange(4)), torch.tensor([3, 1]))
    assert got.bonus_tokens.tolist() == [3, 1]
    check_algorithm(specstrat.EAGLE)
    try:
        build_verify_metadata(torch.tensor([3]), num_tokens=1, backend="triton")
    except KernelError as exc:
        assert "triton is not importable" in str(exc)
    else:
        raise SystemExit("backend='triton' did not fail")
    print("ok")
    """
)


def test_package_works_without_triton() -> None:
    """With triton unimportable, the twins serve every call and backend='triton' says why not."""
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
