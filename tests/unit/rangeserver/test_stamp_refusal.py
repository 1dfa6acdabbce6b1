"""Only a gateway stamps a Kafka producer's state (docs/KAFKA.md, "Idempotent
producers"): a range server refuses an APPEND batch whose system producer id starts
``__kafka/`` unless the connection's roles grant the ``gateway`` action
(``rangeserver.replica.check_stamp``), found by comparing a few bytes."""

from __future__ import annotations

import pytest

from estream.wire.errors import InvalidArgument
from estream.wire.kafkanames import kafka_producer_id, parse_kafka_producer
from estream.wire.record import (
    DIGEST_HMAC_SHA256,
    Record,
    encode_batch,
    encode_records,
    producer_id_starts,
    wrap_records,
)
from rangeserver.replica import check_stamp

RECORDS = [Record(b"v%d" % i, timestamp=1_000) for i in range(3)]


def batch(producer_id: str = "", *, digest: int = 0) -> bytes:
    section = encode_records(RECORDS, producer_id=producer_id,
                             sequences=[4, 5, 6] if producer_id else None, digest=digest)
    return wrap_records(section, stream_id=7, range_index=0, epoch=1, base_offset=0,
                        confirm_offset=0, key=b"k" * 32 if digest else None)


@pytest.mark.parametrize("roles", [set(), {"client"}, {"read"}, {"admin"}, {"member"},
                                   {"none"}])
def test_a_kafka_stamp_without_the_gateway_role_is_refused(roles: set[str]) -> None:
    with pytest.raises(InvalidArgument, match="gateway") as refused:
        check_stamp(batch(kafka_producer_id(7, 0)), roles)
    assert refused.value.fields["argument"] == "producer_id"


@pytest.mark.parametrize("roles", [{"gateway"}, {"all"}, {"client", "gateway"}])
def test_a_gateway_stamps(roles: set[str]) -> None:
    check_stamp(batch(kafka_producer_id(7, 0)), roles)


@pytest.mark.parametrize("producer_id", ["", "p1", "__kafka", "_kafka/1/0", "x__kafka/1/0"])
def test_other_batches_pass_whatever_the_roles(producer_id: str) -> None:
    check_stamp(batch(producer_id), {"client"})
    check_stamp(batch(producer_id, digest=DIGEST_HMAC_SHA256), {"client"})


def test_the_prefix_is_read_from_the_system_block_only() -> None:
    stamped = batch("__kafka/1/0")
    assert producer_id_starts(stamped, b"__kafka/")
    assert producer_id_starts(batch("__kafka/1/0", digest=DIGEST_HMAC_SHA256), b"__kafka/")
    assert not producer_id_starts(stamped[:80], b"__kafka/")  # too short: not read
    # A value that looks like a stamp is a value: no system block, nothing refused.
    plain = encode_batch([Record(b"__kafka/1/0" * 4, timestamp=1)], stream_id=7,
                         range_index=0, epoch=1, base_offset=0, confirm_offset=0)
    assert not producer_id_starts(plain, b"__kafka/")
    check_stamp(plain, ())


def test_kafka_producer_ids_round_trip() -> None:
    assert parse_kafka_producer(kafka_producer_id(1 << 40, 32766)) == (1 << 40, 32766)
    for other in ("__kafka/1", "__kafka/01/0", "__kafka/1/0/x", "__kafka/-1/0", "p1"):
        assert parse_kafka_producer(other) is None
