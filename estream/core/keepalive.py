"""When a writer whose keepalives PD has not answered shows itself on its data path.

PD's lease recovery (``pd/lease.py``) fences a writer whose lease ran out unless
``ack_count`` of its open range's replicas took an APPEND or CONFIRM of its epoch
within the lease (``seen_alive_ms``). An appending writer is seen anyway; an idle one
is not, so keepalives that reach PD late (a loaded client, PD or network) got it
fenced. The client's lease keeper therefore asks a writer whose last answered renewal
is :func:`overdue` to CONFIRM its open range again (nothing new: the replicas only note
that its epoch is alive), once every ``touch_after_ms`` while it stays overdue (a CONFIRM
on each replica: PD down, 10,000 idle writers cost their servers 15,000 a second).

Pure: the caller passes the clock.
"""

from __future__ import annotations

from typing import Final

from estream.wire import limits

touch_after_ms: Final = limits.writer_lease_ms // 2  # unanswered this long: CONFIRM again


def overdue(renewed_ms: int, touched_ms: int | None, now_ms: int,
            after_ms: int = touch_after_ms) -> bool:
    """Whether a writer whose last renewal PD answered was sent at ``renewed_ms``, and
    that last touched its replicas at ``touched_ms`` (None: never), must show itself on
    its data path now: half a lease without an answer leaves PD's recovery a lease's
    other half to see the CONFIRM (a round every 0.5 s, replicas asked within 1 s), and
    one CONFIRM every half lease keeps the replicas' age of it below the lease.

    >>> overdue(0, None, 1_999), overdue(0, None, 2_000), overdue(5_000, None, 5_100)
    (False, True, False)
    >>> overdue(0, 2_000, 3_000), overdue(0, 2_000, 4_000)
    (False, True)
    """
    return now_ms - renewed_ms >= after_ms and (
        touched_ms is None or now_ms - touched_ms >= after_ms)
