"""A range server's APPEND digest check (``rangeserver.replica.check_digest``) and the
cluster secret's settings (``--secret``/``--secret-file``, masked by --check-config)."""

from __future__ import annotations

import argparse

import pytest

from estream.net.security import add_secret_options, load_cluster_secret
from estream.server.config import render_settings
from estream.wire.errors import ChecksumMismatch, DigestMismatch, InvalidArgument
from estream.wire.record import (
    DIGEST_HMAC_SHA256,
    Record,
    encode_batch,
    encode_records,
    stream_key,
    wrap_records,
)
from rangeserver.replica import check_digest

SECRET = b"cluster secret"


def key_for(stream_id: int) -> bytes:
    return stream_key(SECRET, stream_id)


def hmac_batch(secret: bytes = SECRET, stream_id: int = 3) -> bytes:
    section = encode_records([Record(b"v", {}, 1)], digest=DIGEST_HMAC_SHA256)
    return wrap_records(section, stream_id=stream_id, range_index=0, epoch=1, base_offset=0,
                        key=stream_key(secret, stream_id))


def test_a_server_with_the_secret_checks_hmac_batches() -> None:
    check_digest(hmac_batch(), key_for)
    with pytest.raises(DigestMismatch):
        check_digest(hmac_batch(b"another secret"), key_for)
    damaged = bytearray(hmac_batch(b"another secret"))
    damaged[-1] ^= 1
    with pytest.raises(ChecksumMismatch):  # damaged, not forged: retried elsewhere
        check_digest(bytes(damaged), key_for)


def test_other_digests_and_a_server_without_the_secret_check_nothing_here() -> None:
    plain = encode_batch([Record(b"v")], stream_id=3, range_index=0, epoch=1, base_offset=0)
    check_digest(plain, key_for)
    check_digest(hmac_batch(b"another secret"), None)


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_secret_options(parser)
    return parser.parse_args(argv)


def test_secret_settings() -> None:
    assert load_cluster_secret(parse([])) is None
    assert load_cluster_secret(parse(["--secret", "s3"])) == b"s3"
    with pytest.raises(InvalidArgument):
        load_cluster_secret(parse(["--secret", "s3", "--secret-file", "/nonexistent"]))
    with pytest.raises(InvalidArgument, match="cannot read"):
        load_cluster_secret(parse(["--secret-file", "/nonexistent/secret"]))
    shown = render_settings(argparse.Namespace(secret="s3", secret_file="/etc/s"))
    assert 'secret = "***"' in shown and "s3" not in shown and '"/etc/s"' in shown
