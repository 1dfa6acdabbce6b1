"""The options of the ``estream`` Spark source and sink, parsed once into plain dataclasses.

Spark hands a data source its options as a case-insensitive dict of strings; these
dataclasses (plain values, so they pickle) are what the driver-side planner and the
task-side readers carry. An unknown option is an error naming it, the closest known one and
every known one (Spark's Kafka source would quietly ignore a misspelled ``startingOffset``);
Kafka-source options estream does not implement are refused by name. Every option, its
default and its precedence (``startingTimestamp`` > ``startingOffsetsByTimestamp`` >
``startingOffsets``; ``minOffsetsPerTrigger`` with ``maxTriggerDelay``; ``streamPattern``):
docs/spark.md.

Pure: no I/O.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Final

from estream.spark.planning import (
    MAX_TRIGGER_DELAY_MS_DEFAULT,
    MIN_PARTITIONS_DEFAULT,
    PARTITION_RECORDS_DEFAULT,
    check_pattern,
    match_streams,
    parse_duration_ms,
    parse_streams,
)
from estream.wire.errors import InvalidArgument

ARROW_ROWS_DEFAULT = 8_192
CONNECT_TIMEOUT_S_DEFAULT = 10.0

_SECURITY_OPTIONS: Final = ("tlsCa", "tlsCert", "tlsKey", "tokenFile", "secret", "secretFile")
SOURCE_OPTIONS: Final = (
    "pd", "streams", "startingOffsets", "endingOffsets", "startingTimestamp",
    "startingOffsetsByTimestamp", "maxRecordsPerTrigger", "maxOffsetsPerTrigger",
    "failOnDataLoss", "partitionRecords", "arrowRows", "connectTimeoutSeconds",
    "minPartitions", "minOffsetsPerTrigger", "maxTriggerDelay", "streamPattern",
    *_SECURITY_OPTIONS,
    "path",  # Spark's own, from load(path): ignored
)
SINK_OPTIONS: Final = (
    "pd", "stream", "sinkId", "checkpointLocation", "mode", "keyColumn", "streams",
    "createStreams", "replicas", "ackCount", "digest", "connectTimeoutSeconds",
    *_SECURITY_OPTIONS,
    "path",  # Spark's own, from start(path): ignored
)
# Options of Spark's Kafka source that estream's source does not implement.
KAFKA_ONLY_OPTIONS: Final = (
    "subscribe", "subscribePattern", "assign", "startingOffsetsByTimestampStrategy",
    "kafka.bootstrap.servers", "includeHeaders", "groupIdPrefix",
)


def check_known(options: Mapping[str, str], known: tuple[str, ...], what: str) -> None:
    """Raise :class:`InvalidArgument` naming the first option not in ``known``
    (case-insensitively), with the closest known name and the list of known ones.

    >>> check_known({"PD": "h:1"}, ("pd",), "source")
    """
    lowered = {k.lower(): k for k in known}
    for name in options:
        if name.lower() in lowered:
            continue
        if name.lower() in {k.lower() for k in KAFKA_ONLY_OPTIONS}:
            raise InvalidArgument(
                f"option {name!r} of Spark's Kafka source is not supported by the estream "
                f"{what}; its options are: {', '.join(known)}", argument=name)
        close = difflib.get_close_matches(name.lower(), list(lowered), n=1, cutoff=0.6)
        hint = f" (did you mean {lowered[close[0]]!r}?)" if close else ""
        raise InvalidArgument(
            f"unknown option {name!r} for the estream {what}{hint}; its options are: "
            f"{', '.join(known)}", argument=name)


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
    the driver and every executor run.

    ``secret`` (the cluster secret itself) or ``secretFile`` (a file holding it, surrounding
    whitespace stripped): the key that ``hmac-sha256`` streams' MAC keys derive from, so
    executors read and write such streams without ``ESTREAM_SECRET`` in their environment
    (``secretFile`` keeps the secret out of the query's plan and logs; neither: the
    environment variable, as for any client)."""

    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    token_file: str | None = None
    secret: str | None = field(default=None, repr=False)
    secret_file: str | None = None

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> Security:
        def path(key: str) -> str | None:
            return (_get(options, key) or "").strip() or None

        found = cls(path("tlsCa"), path("tlsCert"), path("tlsKey"), path("tokenFile"),
                    _get(options, "secret") or None, path("secretFile"))
        if found.secret is not None and found.secret_file is not None:
            raise InvalidArgument("options 'secret' and 'secretFile' exclude each other",
                                  argument="secretFile")
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
    starting_timestamp: int | None = None  # ms; every stream (wins over the next)
    starting_offsets_by_timestamp: tuple[tuple[str, int], ...] = ()  # (stream, ms)
    min_records_per_trigger: int | None = None  # minOffsetsPerTrigger
    max_trigger_delay_ms: int = MAX_TRIGGER_DELAY_MS_DEFAULT
    # streamPattern: ``streams`` is then () until the source lists the matching streams
    stream_pattern: str | None = None

    def starting_times(self) -> dict[str, int]:
        """The streams that start by time, with their time (ms; module docstring)."""
        if self.starting_timestamp is not None:
            return {name: self.starting_timestamp for name in self.streams}
        return {name: ms for name, ms in self.starting_offsets_by_timestamp
                if name in self.streams}

    def known(self, streams: tuple[str, ...]) -> SourceOptions:
        """These options over ``streams`` (a ``streamPattern`` source's current matches)."""
        return replace(self, streams=streams)

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SourceOptions:
        check_known(options, SOURCE_OPTIONS, "source")
        timeout = _int(options, "connectTimeoutSeconds", None, 1)
        pattern = _get(options, "streamPattern")
        if pattern is not None and (_get(options, "streams") or "").strip():
            raise InvalidArgument("options 'streams' and 'streamPattern' exclude each other",
                                  argument="streamPattern")
        streams = () if pattern is not None else parse_streams(_get(options, "streams"))
        if pattern is not None:
            check_pattern(pattern)
        max_records = _max_records(options)
        min_records = _int(options, "minOffsetsPerTrigger", None, 1)
        if min_records is not None and max_records is not None and min_records > max_records:
            raise InvalidArgument(f"option 'minOffsetsPerTrigger' ({min_records}) exceeds "
                                  f"'maxOffsetsPerTrigger' ({max_records})",
                                  argument="minOffsetsPerTrigger")
        delay = (_get(options, "maxTriggerDelay") or "").strip()
        return cls(
            pd=_pd(options),
            streams=streams,
            starting_offsets=_get(options, "startingOffsets"),
            ending_offsets=_get(options, "endingOffsets"),
            max_records_per_trigger=max_records,
            fail_on_data_loss=_bool(options, "failOnDataLoss", True),
            partition_records=_int(options, "partitionRecords", PARTITION_RECORDS_DEFAULT, 1)
            or PARTITION_RECORDS_DEFAULT,
            arrow_rows=_int(options, "arrowRows", ARROW_ROWS_DEFAULT, 1) or ARROW_ROWS_DEFAULT,
            connect_timeout_s=float(timeout) if timeout else CONNECT_TIMEOUT_S_DEFAULT,
            min_partitions=_int(options, "minPartitions", MIN_PARTITIONS_DEFAULT, 1)
            or MIN_PARTITIONS_DEFAULT,
            security=Security.parse(options),
            starting_timestamp=_int(options, "startingTimestamp", None, -(2**63)),
            starting_offsets_by_timestamp=_by_timestamp(options, streams, pattern),
            min_records_per_trigger=min_records,
            max_trigger_delay_ms=parse_duration_ms(delay, "maxTriggerDelay") if delay
            else MAX_TRIGGER_DELAY_MS_DEFAULT,
            stream_pattern=pattern,
        )


def _max_records(options: Mapping[str, str]) -> int | None:
    """``maxRecordsPerTrigger``, or its Kafka name ``maxOffsetsPerTrigger``."""
    ours = _int(options, "maxRecordsPerTrigger", None, 1)
    kafka = _int(options, "maxOffsetsPerTrigger", None, 1)
    if ours is not None and kafka is not None and ours != kafka:
        raise InvalidArgument("options 'maxRecordsPerTrigger' and 'maxOffsetsPerTrigger' "
                              "(its Kafka name) disagree", argument="maxOffsetsPerTrigger")
    return ours if ours is not None else kafka


def _by_timestamp(options: Mapping[str, str], streams: tuple[str, ...],
                  pattern: str | None = None) -> tuple[tuple[str, int], ...]:
    """``startingOffsetsByTimestamp``: a JSON object ``{"stream": ms}`` over ``streams``
    (with ``streamPattern``: over names the pattern matches)."""
    key = "startingOffsetsByTimestamp"
    text = (_get(options, key) or "").strip()
    if not text:
        return ()
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError:
        parsed = None
    if not isinstance(parsed, dict) or not all(
            isinstance(v, int) and not isinstance(v, bool) for v in parsed.values()):
        raise InvalidArgument(f"option {key!r} must be a JSON object {{\"stream\": "
                              f"milliseconds since the epoch}}, not {text!r}", argument=key)
    if pattern is not None:
        unknown = sorted(set(parsed) - set(match_streams(pattern, list(parsed))))
        where = "'streamPattern' does not match"
    else:
        unknown = sorted(set(parsed) - set(streams))
        where = "not in 'streams'"
    if unknown:
        raise InvalidArgument(f"option {key!r} names streams {where}: {unknown}",
                              argument=key)
    return tuple(sorted(parsed.items()))


@dataclass(frozen=True, slots=True)
class SinkOptions:
    """Options of ``df.writeStream.format("estream")``.

    ``sink_id`` names this query's records in the stream (see ``estream/spark/commit.py``):
    option ``sinkId``, else the query's ``checkpointLocation``, else ``"default"`` (driver
    mode only: executors mode needs one of the two, :func:`check_executors_sink_id`).
    Unknown options are refused by name (:func:`check_known`).

    Routing (``estream/spark/routing.py``): ``key_column`` (option ``keyColumn``) with
    ``key_streams`` (option ``streams``, N) hashes each row's key into ``<stream>-<k>``;
    ``stream`` is empty when a ``stream`` column names each row's stream. Streams the sink
    writes from its tasks are created on demand with ``replicas``, ``ack_count`` and
    ``digest`` (options ``replicas``, ``ackCount``, ``digest``) unless ``createStreams`` is
    false, when a missing one fails the task with ``StreamNotFound`` naming it.
    """

    pd: str
    stream: str
    sink_id: str
    connect_timeout_s: float
    security: Security = Security()
    key_column: str | None = None
    key_streams: int | None = None
    create_streams: bool = True
    replicas: int = 3
    ack_count: int = 2
    digest: str | None = None

    @classmethod
    def parse(cls, options: Mapping[str, str], *, stream_column: bool = False) -> SinkOptions:
        """``stream_column``: the frame has a ``stream`` column, which routes rows when the
        option ``stream`` is not given."""
        check_known(options, SINK_OPTIONS, "sink")
        stream = (_get(options, "stream") or "").strip()
        key_column = (_get(options, "keyColumn") or "").strip() or None
        key_streams = _int(options, "streams", None, 1)
        if (key_column is None) != (key_streams is None):
            raise InvalidArgument("options 'keyColumn' and 'streams' (how many streams the "
                                  "key hashes into) go together", argument="keyColumn")
        if not stream and (key_column is not None or not stream_column):
            raise InvalidArgument(
                "option 'stream' (the target stream, or the prefix of a keyed family) is "
                "required unless a 'stream' column names each row's stream", argument="stream"
            )
        replicas = _int(options, "replicas", 3, 1) or 3
        ack_count = _int(options, "ackCount", min(2, replicas), 1) or 1
        if ack_count > replicas:
            raise InvalidArgument(f"option 'ackCount' ({ack_count}) exceeds 'replicas' "
                                  f"({replicas})", argument="ackCount")
        sink_id = (_get(options, "sinkId") or _get(options, "checkpointLocation") or "").strip()
        timeout = _int(options, "connectTimeoutSeconds", None, 1)
        return cls(
            pd=_pd(options),
            stream=stream,
            sink_id=sink_id or "default",
            connect_timeout_s=float(timeout) if timeout else CONNECT_TIMEOUT_S_DEFAULT,
            security=Security.parse(options),
            key_column=key_column,
            key_streams=key_streams,
            create_streams=_bool(options, "createStreams", True),
            replicas=replicas,
            ack_count=ack_count,
            digest=(_get(options, "digest") or "").strip() or None,
        )


def check_executors_sink_id(options: Mapping[str, str]) -> None:
    """Executors mode needs option ``sinkId`` or ``checkpointLocation``: its tasks are the
    idempotent producers ``spark-<hash of the sink id>-<partition>``, so two queries that
    both fell back to one id would share producer ids in a stream they both write, fence
    each other's tasks and drop each other's rows as duplicates.

    >>> check_executors_sink_id({"checkpointLocation": "/ckpt/q1"})
    """
    if (_get(options, "sinkId") or _get(options, "checkpointLocation") or "").strip():
        return
    raise InvalidArgument(
        "estream sink: mode 'executors' needs option 'sinkId' (a name unique to this query, "
        "kept across its restarts) or 'checkpointLocation': without either, two queries "
        "would write as the same producers and drop or fence each other's rows "
        "(a checkpoint root set in the session's configuration is not passed to the sink)",
        argument="sinkId")
