"""estream: a replicated stream-storage engine.

The public SDK (``estream.connect``, :class:`Client`, :class:`Writer`), the model
(:class:`Record`, :class:`StreamMeta`, :class:`RangeMeta`) and the typed errors live here;
see README.md.
"""

from estream import errors as _errors
from estream.client import Client, connect
from estream.errors import *  # noqa: F403
from estream.errors import EstreamError
from estream.meta import RangeMeta, ServerInfo, StreamMeta
from estream.record import BatchColumns, Record
from estream.writer import Writer

__all__ = [
    "BatchColumns",
    "Client",
    "EstreamError",
    "RangeMeta",
    "Record",
    "ServerInfo",
    "StreamMeta",
    "Writer",
    "connect",
    *sorted(
        name
        for name, value in vars(_errors).items()
        if isinstance(value, type) and issubclass(value, EstreamError)
    ),
]
__version__ = "0.1.0"
