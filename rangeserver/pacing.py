"""How long a range server holds an append's answer while its disk fills. Pure.

Writers that outrun the drain (sealed ranges uploaded to the object tier, then their
local replicas dropped) would fill the range servers' disks, and a server out of room
refuses appends: when every server is, writers can only wait for room until their
delivery timeout fails them. So a server above its disk watermark answers each append
(APPEND, APPEND_MANY: the batch is stored and durable first) a little later, more the
fuller it is: from ``append_delay_ms_min`` just above the watermark to ``append_delay_ms_max``
with the disk full. A writer keeps a bounded number of appends in flight, so its rate
falls with the delay and the drain catches up; nothing fails. When only some servers
are above it, writers acknowledged by the others do not wait (the slow replica lags,
and its chase bound rolls the range elsewhere); PD places new replicas there last and
offloads their ranges first (``pd/placement.py``).

>>> append_delay_ms(used=50, total=100, watermark_percent=90)
0
>>> append_delay_ms(used=90, total=100, watermark_percent=90)  # at it, not above
0
>>> append_delay_ms(used=901, total=1000, watermark_percent=90)
6
>>> append_delay_ms(used=100, total=100, watermark_percent=90) == append_delay_ms_max
True
>>> append_delay_ms(used=95, total=100, watermark_percent=90)
52
"""

from __future__ import annotations

from typing import Final

append_delay_ms_min: Final = 5  # at the watermark
append_delay_ms_max: Final = 100  # with the disk full (below a writer's chase bound)


def append_delay_ms(*, used: int, total: int, watermark_percent: int) -> int:
    """The delay before answering an append, with ``used`` of ``total`` disk bytes used."""
    if total <= 0 or used * 100 <= watermark_percent * total:
        return 0
    room = total * (100 - watermark_percent) / 100
    filled = 1.0 if room <= 0 else min(1.0, (used - total * watermark_percent / 100) / room)
    return round(append_delay_ms_min + filled * (append_delay_ms_max - append_delay_ms_min))
