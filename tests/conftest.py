"""Suite-wide pytest set-up: every asyncio test runs on uvloop, as the servers do, and no
process a test started outlives the session (see ``estream/devcluster/process.py``)."""

from __future__ import annotations

import signal
from collections.abc import Callable, Mapping
from typing import Any

import uvloop

from estream.devcluster.process import reap_all


def pytest_asyncio_loop_factories(config: Any, item: Any) -> Mapping[str, Callable[[], Any]]:
    return {"uvloop": uvloop.new_event_loop}


def pytest_configure(config: Any) -> None:
    # SIGTERM (a CI time-out, `timeout`) becomes an interrupt: fixtures' finalizers run.
    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, interrupt)


def pytest_sessionfinish(session: Any, exitstatus: int) -> None:
    leftover = reap_all()
    if leftover:
        print(f"\nreaped {len(leftover)} test processes left running: {leftover}")
