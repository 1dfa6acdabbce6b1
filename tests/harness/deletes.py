"""A delete refused while servers of the open range hang, then done, for tests only: the
steps the unstriped and the striped delete tests share (hang, refused, resume, delete).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import pytest

import estream
from estream.devcluster.cluster import Cluster
from estream.wire.errors import FenceIncomplete, StreamNotFound
from estream.wire.meta import ReplicaRef
from pd.shell.rangeops import fence_timeout_s

# One fence round (every replica asked at once, each for fence_timeout_s), the new epoch and
# the answer: well under a client's timeout, which the client's own retries of each try
# (each at a new epoch) used to run out before the caller heard anything.
refused_within_s = fence_timeout_s + 2.5


async def delete_refused_while_hung(cluster: Cluster, client: estream.Client, name: str,
                                    hung: Sequence[ReplicaRef]) -> None:
    """Hang (SIGSTOP) the range servers ``hung``: ``delete_stream(name)`` is refused with
    :class:`FenceIncomplete` naming exactly them, after one try (the epoch moved once:
    the writers are fenced) and within :data:`refused_within_s`; the stream is still
    there. Once they answer again, the delete again succeeds."""
    before = await client.describe_stream(name)
    for ref in hung:
        cluster.pause(ref.address)
    try:
        started = time.monotonic()
        with pytest.raises(FenceIncomplete) as refused:
            await client.delete_stream(name)
        took = time.monotonic() - started
        after = await client.describe_stream(name)
    finally:
        for ref in hung:
            cluster.resume(ref.address)
    assert sorted(refused.value.servers) == sorted(ref.id for ref in hung), refused.value
    assert refused.value.stream == name
    assert "deleting it again is safe" in refused.value.message, refused.value.message
    assert took < refused_within_s, f"refused after {took:.1f}s"
    assert (after.id, after.epoch) == (before.id, before.epoch + 1)  # one try, not retries
    await client.delete_stream(name)
    with pytest.raises(StreamNotFound):
        await client.describe_stream(name)
