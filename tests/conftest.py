"""Suite-wide pytest set-up: every asyncio test runs on uvloop, as the servers do."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import uvloop


def pytest_asyncio_loop_factories(config: Any, item: Any) -> Mapping[str, Callable[[], Any]]:
    return {"uvloop": uvloop.new_event_loop}
