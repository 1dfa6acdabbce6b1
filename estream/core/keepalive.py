"""When a writer whose keepalives PD has not answered shows itself on its data path.

PD's lease recovery (``pd/lease.py``) fences a writer whose lease ran out unless
``ack_count`` of its open range's replicas took an APPEND or CONFIRM of its epoch
within the lease (``seen_alive_ms``). An appending writer is seen anyway; an idle one
is not, so keepalives that reach PD late (a loaded client, PD or network) got it
fenced. The client's lease keeper therefore asks a writer whose last answered renewal
is :func:`overdue` to CONFIRM its open range again (nothing new: the replicas only note
that its epoch is alive), once a keeper interval while it stays overdue.

Pure: the caller passes the clock.
"""

from __future__ import annotations

from typing import Final

from estream.wire import limits

touch_after_ms: Final = limits.writer_lease_ms // 2  # unanswered this long: CONFIRM again


def overdue(renewed_ms: int, now_ms: int, after_ms: int = touch_after_ms) -> bool:
    """Whether a writer whose last renewal PD answered was sent at ``renewed_ms`` must
    show itself on its data path now: half a lease without an answer leaves PD's
    recovery a lease's other half to see the CONFIRM (a round every 0.5 s, replicas
    asked within 1 s).

    >>> overdue(0, 1_999), overdue(0, 2_000), overdue(5_000, 5_100)
    (False, True, False)
    """
    return now_ms - renewed_ms >= after_ms
