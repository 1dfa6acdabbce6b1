"""The options of the ``estream`` Spark source and sink, parsed once into plain dataclasses.

Spark hands a data source its options as a case-insensitive dict of strings; these
dataclasses are what the driver-side planner and the pickled task-side readers carry
(plain values only, so they pickle).

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from estream.spark.planning import (
    MIN_PARTITIONS_DEFAULT,
    PARTITION_RECORDS_DEFAULT,
    parse_streams,
)
from estream.wire.errors import InvalidArgument

ARROW_ROWS_DEFAULT = 8_192
CONNECT_TIMEOUT_S_DEFAULT = 10.0


def _get(options: Mapping[str, str], key: str) -> str | None:
    """Option ``key``, case-insensitively (Spark's own dict is; a plain dict may not be)."""
    lowered = key.lower()
    for name, value in options.items():
        if name.lower() == lowered:
            return None if value is None else str(value)
    return None


def _int(options: Mapping[str, str], key: str, default: int | None, minimum: int) -> int | None:
    text = _get(options, key)
    if text is None or text.strip() == "":
        return default
    try:
        value = int(text)
    except ValueError:
        raise InvalidArgument(
            f"option {key!r} must be an integer, not {text!r}", argument=key
        ) from None
    if value < minimum:
        raise InvalidArgument(f"option {key!r} must be >= {minimum}, not {value}", argument=key)
    return value


def _bool(options: Mapping[str, str], key: str, default: bool) -> bool:
    text = _get(options, key)
    if text is None or text.strip() == "":
        return default
    if text.strip().lower() in ("true", "1", "yes"):
        return True
    if text.strip().lower() in ("false", "0", "no"):
        return False
    raise InvalidArgument(f"option {key!r} must be true or false, not {text!r}", argument=key)


def _pd(options: Mapping[str, str]) -> str:
    pd = (_get(options, "pd") or "").strip()
    if not pd:
        raise InvalidArgument(
            "option 'pd' (placement driver addresses, host:port,...) is required", argument="pd"
        )
    return pd


@dataclass(frozen=True, slots=True)
class Security:
    """TLS and authentication towards a secured cluster: options ``tlsCa`` (PEM of the CA
    that signs the cluster's certificates; turns TLS on), ``tlsCert`` and ``tlsKey`` (a
    client certificate, for mutual TLS) and ``tokenFile`` (a file whose first line is the
    token). Paths, not secrets, travel in the query's options: each must be readable where
    the driver and every executor run."""

    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    token_file: str | None = None

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> Security:
        def path(key: str) -> str | None:
            return (_get(options, key) or "").strip() or None

        found = cls(path("tlsCa"), path("tlsCert"), path("tlsKey"), path("tokenFile"))
        if (found.tls_cert is None) != (found.tls_key is None):
            raise InvalidArgument("options 'tlsCert' and 'tlsKey' go together",
                                  argument="tlsCert")
        if found.tls_cert is not None and found.tls_ca is None:
            raise InvalidArgument("option 'tlsCert' needs 'tlsCa' (TLS is on only with a CA)",
                                  argument="tlsCa")
        return found


@dataclass(frozen=True, slots=True)
class SourceOptions:
    """Options of ``spark.readStream.format("estream")`` and ``spark.read.format(...)``."""

    pd: str
    streams: tuple[str, ...]
    starting_offsets: str | None
    ending_offsets: str | None
    max_records_per_trigger: int | None
    fail_on_data_loss: bool
    partition_records: int
    arrow_rows: int
    connect_timeout_s: float
    min_partitions: int = MIN_PARTITIONS_DEFAULT
    security: Security = Security()

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SourceOptions:
        timeout = _int(options, "connectTimeoutSeconds", None, 1)
        return cls(
            pd=_pd(options),
            streams=parse_streams(_get(options, "streams")),
            starting_offsets=_get(options, "startingOffsets"),
            ending_offsets=_get(options, "endingOffsets"),
            max_records_per_trigger=_int(options, "maxRecordsPerTrigger", None, 1),
            fail_on_data_loss=_bool(options, "failOnDataLoss", True),
            partition_records=_int(options, "partitionRecords", PARTITION_RECORDS_DEFAULT, 1)
            or PARTITION_RECORDS_DEFAULT,
            arrow_rows=_int(options, "arrowRows", ARROW_ROWS_DEFAULT, 1) or ARROW_ROWS_DEFAULT,
            connect_timeout_s=float(timeout) if timeout else CONNECT_TIMEOUT_S_DEFAULT,
            min_partitions=_int(options, "minPartitions", MIN_PARTITIONS_DEFAULT, 1)
            or MIN_PARTITIONS_DEFAULT,
            security=Security.parse(options),
        )


@dataclass(frozen=True, slots=True)
class SinkOptions:
    """Options of ``df.writeStream.format("estream")``.

    ``sink_id`` names this query's records in the stream (see ``estream/spark/commit.py``):
    option ``sinkId``, else the query's ``checkpointLocation``, else ``"default"``.
    """

    pd: str
    stream: str
    sink_id: str
    connect_timeout_s: float
    security: Security = Security()

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SinkOptions:
        stream = (_get(options, "stream") or "").strip()
        if not stream:
            raise InvalidArgument(
                "option 'stream' (the target stream) is required", argument="stream"
            )
        sink_id = (_get(options, "sinkId") or _get(options, "checkpointLocation") or "").strip()
        timeout = _int(options, "connectTimeoutSeconds", None, 1)
        return cls(
            pd=_pd(options),
            stream=stream,
            sink_id=sink_id or "default",
            connect_timeout_s=float(timeout) if timeout else CONNECT_TIMEOUT_S_DEFAULT,
            security=Security.parse(options),
        )
