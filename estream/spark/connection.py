"""Connecting to the estream cluster from the Spark driver or an executor, with the
query's options (placement driver addresses, timeout, TLS, token and cluster secret).

Side effects: reads the token and secret files, opens connections.
"""

from __future__ import annotations

import estream
from estream.net.security import load_token_file
from estream.spark.options import SinkOptions, SourceOptions
from estream.wire.errors import InvalidArgument, Unavailable


def load_secret(opts: SourceOptions | SinkOptions) -> bytes | None:
    """The cluster secret of option ``secret`` or the file of ``secretFile`` (surrounding
    whitespace stripped); None: the client falls back to ``ESTREAM_SECRET``."""
    sec = opts.security
    if sec.secret is not None:
        return sec.secret.encode()
    if sec.secret_file is None:
        return None
    try:
        with open(sec.secret_file, "rb") as f:
            secret = f.read().strip()
    except OSError as exc:
        raise InvalidArgument(f"option 'secretFile': cannot read {sec.secret_file!r}: "
                              f"{exc.strerror}", argument="secretFile") from None
    if not secret:
        raise InvalidArgument(f"option 'secretFile': {sec.secret_file!r} is empty",
                              argument="secretFile")
    return secret


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
            secret=load_secret(opts),
        )
    except Unavailable as exc:
        raise Unavailable(f"{who}: cannot reach the placement driver at {opts.pd!r}: {exc}") \
            from exc
