"""The PD leader's periodic background work (repair, reclaim): one loop for both.

:func:`leader_rounds` sleeps ``interval_ms``, checks that this node is the Raft leader
(only the leader acts: followers would act on the same catalog twice), and runs one
round; a round that raises is logged and the next one runs anyway (one that meets a
leadership change, ``Unavailable``, in one line: it is not a fault).

Side effects: none of its own (the rounds have theirs).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from estream.wire.errors import Unavailable
from pd.shell.service import PdService

log = logging.getLogger(__name__)


def is_leader(service: PdService) -> bool:
    return service.raft.status().role == "leader"


async def leader_rounds(
    service: PdService,
    interval_ms: int,
    round_: Callable[[], Awaitable[object]],
    *,
    name: str,
    on_follower: Callable[[], None] | None = None,
) -> None:
    """Forever (until cancelled): ``round_()`` every ``interval_ms`` while leader;
    ``on_follower()`` instead while not."""
    while True:
        await asyncio.sleep(interval_ms / 1000)
        if not is_leader(service):
            if on_follower is not None:
                on_follower()
            continue
        try:
            await round_()
        except Unavailable as exc:  # leadership moved or no majority: the next round retries
            log.warning("%s round stopped: %s", name, exc.message)
        except Exception:  # noqa: BLE001 - one bad round must not stop the next
            log.exception("%s round failed", name)
