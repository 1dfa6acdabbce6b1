"""estream: a replicated stream-storage engine.

The public SDK (``estream.connect``) and the typed errors live here; see README.md.
"""

from estream.errors import *  # noqa: F403
from estream.errors import EstreamError
from estream.record import Record

__all__ = ["EstreamError", "Record"]
__version__ = "0.1.0"
