"""How long a range server holds an append's answer while its disk fills. Pure.

Writers that outrun the drain (sealed ranges uploaded, then their local replicas
dropped) would fill the range servers' disks, and once every server refuses appends a
writer can only wait until its delivery timeout fails it. So above its disk watermark a
server answers each append (the batch stored and durable first) a little later, more
the fuller it is: a writer keeps a bounded number of appends in flight, so its rate
falls and the drain catches up; nothing fails. Where only some servers are above it,
the others acknowledge, the slow replica lags and its chase bound rolls the range away.
"""

from __future__ import annotations

from typing import Final

append_delay_ms_min: Final = 5  # at the watermark
append_delay_ms_max: Final = 100  # with the disk full (below a writer's chase bound)


def append_delay_ms(*, used: int, total: int, watermark_percent: int) -> int:
    """The delay before answering an append, with ``used`` of ``total`` disk bytes used:
    ``append_delay_ms_min`` just above the watermark up to ``append_delay_ms_max`` full.

    >>> append_delay_ms(used=50, total=100, watermark_percent=90)
    0
    >>> append_delay_ms(used=90, total=100, watermark_percent=90)  # at it, not above
    0
    >>> append_delay_ms(used=901, total=1000, watermark_percent=90)
    6
    >>> append_delay_ms(used=95, total=100, watermark_percent=90)
    52
    >>> append_delay_ms(used=100, total=100, watermark_percent=90) == append_delay_ms_max
    True
    """
    if total <= 0 or used * 100 <= watermark_percent * total:
        return 0
    room = total * (100 - watermark_percent) / 100
    filled = 1.0 if room <= 0 else min(1.0, (used - total * watermark_percent / 100) / room)
    return round(append_delay_ms_min + filled * (append_delay_ms_max - append_delay_ms_min))
