"""Prefill-process doubles for the disaggregation fault tests (monkeypatched over
``specstrat.runtime._disagg.process.prefill_main``; importable by the spawned process)."""

import os
import time
from dataclasses import replace
from typing import Any

import torch.distributed as dist

from specstrat.runtime import Request
from specstrat.runtime._disagg import PrefillWorker, send_transfer
from specstrat.runtime._disagg.process import connect
from specstrat.runtime._disagg.wire import encode


def die_before_connect(*args: Any) -> None:
    """Exit at once, as if the algorithm could not be unpickled there."""
    os._exit(3)


def stall_before_connect(port: int, *args: Any) -> None:
    """Stay alive without ever connecting; the decode side must kill it."""
    time.sleep(300)


def _first_batch_then(
    port: int,
    algo: Any,
    requests: list[Request],
    batch_size: int,
    context_len: int,
    loader: Any,
    timeout: float,
    device: str,
    *,
    second: str,
) -> None:
    connect(port, 0, "gloo", timeout)
    worker = PrefillWorker(algo, loader(device), context_len=context_len, batch_size=batch_size)
    send_transfer(worker.prefill(requests[:batch_size]), dst=1)
    batch = worker.prefill(requests[batch_size : 2 * batch_size])
    if second == "die":
        for part in encode(batch)[:3]:  # the header and the request ids, then nothing
            dist.send(part, 1)
        os._exit(17)  # as if killed: no end marker, no clean shutdown
    hidden = batch.payload.hidden_states
    assert hidden is not None
    bad = replace(batch, payload=replace(batch.payload, hidden_states=hidden[:, :-1]))
    send_transfer(bad, dst=1)
    send_transfer(None, dst=1)
    dist.destroy_process_group()


def die_mid_transfer(*args: Any) -> None:
    """Send the first batch, then half of the second, then die."""
    _first_batch_then(*args, second="die")


def bad_hidden_width(*args: Any) -> None:
    """Send the first batch, then a second whose hidden states are one column short."""
    _first_batch_then(*args, second="narrow")
