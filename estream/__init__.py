"""estream: a replicated stream-storage engine.

The public SDK (``estream.connect``, :class:`Client`, :class:`Writer`), the model
(:class:`Record`, :class:`StreamMeta`, :class:`RangeMeta`) and the typed errors live here;
see README.md.

The SDK's names load lazily (PEP 562): ``import estream.wire.errors`` or a pure core such as
``pd.catalog`` loads no asyncio, ssl or SDK module; ``estream.connect`` loads the SDK on
first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from estream.wire import errors as _errors
from estream.wire.errors import *  # noqa: F403
from estream.wire.errors import EstreamError

if TYPE_CHECKING:
    from estream.net.gctune import tune_gc
    from estream.net.portprobe import WrongPort
    from estream.sdk.client import Client, connect
    from estream.sdk.writer import Writer
    from estream.wire.meta import RangeMeta, ServerInfo, StreamMeta
    from estream.wire.record import BatchColumns, Record

_LAZY: dict[str, str] = {
    "BatchColumns": "estream.wire.record",
    "Client": "estream.sdk.client",
    "RangeMeta": "estream.wire.meta",
    "Record": "estream.wire.record",
    "ServerInfo": "estream.wire.meta",
    "StreamMeta": "estream.wire.meta",
    "Writer": "estream.sdk.writer",
    "WrongPort": "estream.net.portprobe",
    "connect": "estream.sdk.client",
    "tune_gc": "estream.net.gctune",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'estream' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "BatchColumns",
    "Client",
    "EstreamError",
    "RangeMeta",
    "Record",
    "ServerInfo",
    "StreamMeta",
    "Writer",
    "WrongPort",
    "connect",
    "tune_gc",
    *sorted(
        name
        for name, value in vars(_errors).items()
        if isinstance(value, type) and issubclass(value, EstreamError)
    ),
]
__version__ = "0.1.0"
