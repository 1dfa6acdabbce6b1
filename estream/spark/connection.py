"""Connecting to the estream cluster from the Spark driver or an executor, with the
query's options (placement driver addresses, timeout, TLS and token).

Side effects: reads the token file, opens connections.
"""

from __future__ import annotations

import estream
from estream.net.security import load_token_file
from estream.spark.options import SinkOptions, SourceOptions
from estream.wire.errors import Unavailable


async def connect(opts: SourceOptions | SinkOptions, who: str = "estream") -> estream.Client:
    """A client of the cluster the options name; :class:`Unavailable` naming the PD
    addresses when it cannot be reached (``who`` starts the message: source or sink),
    :class:`~estream.wire.errors.Unauthenticated` when the cluster refuses the token."""
    sec = opts.security
    token = load_token_file(sec.token_file)[0] if sec.token_file else None
    try:
        return await estream.connect(
            opts.pd, timeout_s=opts.connect_timeout_s, tls_ca=sec.tls_ca,
            tls_cert=sec.tls_cert, tls_key=sec.tls_key, token=token,
        )
    except Unavailable as exc:
        raise Unavailable(f"{who}: cannot reach the placement driver at {opts.pd!r}: {exc}") \
            from exc
