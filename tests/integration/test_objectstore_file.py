"""estream/net/objectstore.py against a ``file://`` store: put, get, ranges, head, list,
delete, and typed errors for a missing object, a bad URL and missing S3 credentials."""

from __future__ import annotations

from pathlib import Path

import pytest

from estream.net.objectstore import ObjectStore
from estream.wire.errors import InvalidArgument, ObjectStoreError


async def test_file_store_round_trip(tmp_path: Path) -> None:
    store = ObjectStore.from_url(f"file://{tmp_path}/objects")
    assert store.describe() == {"url": f"file://{tmp_path}/objects", "endpoint": None}
    await store.put("a/b/one.eso", b"0123456789")
    assert await store.get("a/b/one.eso") == b"0123456789"
    assert await store.get_range("a/b/one.eso", 2, 5) == b"234"
    assert await store.get_ranges("a/b/one.eso", [(0, 1), (8, 10)]) == [b"0", b"89"]
    assert await store.head("a/b/one.eso") == 10
    listed = await store.list("a")
    assert [(o.key, o.size) for o in listed] == [("a/b/one.eso", 10)]
    assert (tmp_path / "objects" / "a" / "b" / "one.eso").read_bytes() == b"0123456789"
    await store.delete("a/b/one.eso")
    await store.delete("a/b/one.eso")  # deleting twice is fine
    with pytest.raises(ObjectStoreError) as info:
        await store.head("a/b/one.eso")
    assert info.value.fields["not_found"] is True
    with pytest.raises(ObjectStoreError):
        await store.get("missing")
    with pytest.raises(ObjectStoreError):
        await store.get_range("missing", 0, 4)
    assert await store.list("nothing") == []


def test_bad_urls_and_credentials() -> None:
    for url in ("http://x/y", "file://relative/dir", "s3:///prefix", "nothing"):
        with pytest.raises(InvalidArgument):
            ObjectStore.from_url(url, env={"AWS_ACCESS_KEY_ID": "k",
                                           "AWS_SECRET_ACCESS_KEY": "s"})
    with pytest.raises(InvalidArgument):
        ObjectStore.from_url("s3://bucket/prefix", "http://127.0.0.1:1", env={})
    with pytest.raises(InvalidArgument):
        ObjectStore.from_url("s3://bucket", "ftp://127.0.0.1:1",
                             env={"AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s"})
    store = ObjectStore.from_url("s3://bucket/p", "http://127.0.0.1:1",
                                 env={"AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s"})
    assert store.describe() == {"url": "s3://bucket/p", "endpoint": "http://127.0.0.1:1"}


async def test_unreachable_s3_is_a_typed_error_within_the_deadline() -> None:
    store = ObjectStore.from_url("s3://bucket/p", "http://127.0.0.1:9", timeout_s=3.0,
                                 env={"AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s"})
    with pytest.raises(ObjectStoreError):
        await store.put("k", b"x")
