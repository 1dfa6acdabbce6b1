"""Consumer groups through the Kafka gateway with real clients (issue 31, items 3-5):
kafka-python (its defaults: auto commit), confluent-kafka (librdkafka) and aiokafka join
groups, share partitions, rebalance when a member leaves, and resume from the offsets
they committed (the streams' named cursors, read back through the SDK); hostile group
requests get Kafka error codes and the gateway keeps serving; a PD leader change in the
middle of a group loses no committed offset; an SDK subscription reads on into a stream
deleted and made again under its name. One cluster and gateway for the module.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import estream
from estream.devcluster.kafka import start_kafka
from tests.integration.kafkaframes import call_on, frame, read_exactly

pytestmark = [
    pytest.mark.integration, pytest.mark.cluster(pd_nodes=3, range_servers=3),
    pytest.mark.filterwarnings("ignore:(read_text|open_text) is deprecated:DeprecationWarning"),
]

WAIT_S = 40.0


@dataclass(frozen=True)
class Gateway:
    address: str
    pd: str
    log: Path
    http: str = ""  # host:port of its /metrics


@pytest.fixture(scope="module")
def gateway(module_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    log_dir = tmp_path_factory.mktemp("kafka-groups")
    process, address, http = start_kafka(log_dir, module_cluster.pd_addresses)
    try:
        yield Gateway(address, module_cluster.pd_addresses, log_dir / "kafka.log", http)
    finally:
        process.stop()


def create_topic(gateway: Gateway, name: str, partitions: int) -> None:
    from kafka.admin import KafkaAdminClient, NewTopic

    client = KafkaAdminClient(bootstrap_servers=gateway.address, request_timeout_ms=20_000)
    try:
        client.create_topics([NewTopic(name, partitions, -1)])
    finally:
        client.close()


def produce(gateway: Gateway, topic: str, partitions: int, per_partition: int,
            tag: str = "r") -> set[bytes]:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": gateway.address, "linger.ms": 5})
    sent = set()
    for p in range(partitions):
        for i in range(per_partition):
            value = f"{tag}-{p}-{i}".encode()
            producer.produce(topic, value, partition=p)
            sent.add(value)
    assert producer.flush(WAIT_S) == 0
    return sent


def cursors(gateway: Gateway, group: str, streams: list[str]) -> dict[str, int | None]:
    async def read() -> dict[str, int | None]:
        async with await estream.connect(gateway.pd) as sdk:
            return {s: await sdk.cursor_offset(s, group) for s in streams}

    return asyncio.run(read())


def group_state(gateway: Gateway, group: str) -> dict[str, Any]:
    """The group as PD holds it (for a failed assertion's message)."""
    from estream.sdk.groups import GroupClient

    async def read() -> dict[str, Any]:
        async with await estream.connect(gateway.pd) as sdk:
            return await GroupClient(sdk.pd).describe(group)

    return asyncio.run(read())


def confluent_consumer(gateway: Gateway, group: str, **extra: Any) -> Any:
    from confluent_kafka import Consumer

    return Consumer({"bootstrap.servers": gateway.address, "group.id": group,
                     "auto.offset.reset": "earliest", "enable.auto.commit": False,
                     "session.timeout.ms": 10_000, "heartbeat.interval.ms": 500,
                     "fetch.wait.max.ms": 100, **extra})


def test_kafka_python_group_with_defaults_commits_and_a_new_consumer_resumes(
        gateway: Gateway) -> None:
    from kafka import KafkaConsumer

    create_topic(gateway, "kp-group", 2)
    first = produce(gateway, "kp-group", 2, 10, "a")
    consumer = KafkaConsumer("kp-group", bootstrap_servers=gateway.address,
                             group_id="kp-g", auto_offset_reset="earliest",
                             consumer_timeout_ms=3_000)
    try:
        seen = [m.value for m in consumer]
        deadline = time.monotonic() + WAIT_S
        while len(seen) < len(first) and time.monotonic() < deadline:
            seen += [m.value for m in consumer]
    finally:
        consumer.close()  # auto commit: commits what it consumed, then leaves
    assert sorted(seen) == sorted(first)
    assert cursors(gateway, "kp-g", ["kp-group-0", "kp-group-1"]) == {
        "kp-group-0": 10, "kp-group-1": 10}
    second = produce(gateway, "kp-group", 2, 5, "b")
    consumer = KafkaConsumer("kp-group", bootstrap_servers=gateway.address,
                             group_id="kp-g", auto_offset_reset="earliest",
                             consumer_timeout_ms=3_000)
    try:
        resumed = [m.value for m in consumer]
        deadline = time.monotonic() + WAIT_S
        while len(resumed) < len(second) and time.monotonic() < deadline:
            resumed += [m.value for m in consumer]
    finally:
        consumer.close()
    assert sorted(resumed) == sorted(second)  # nothing lost, nothing again


def _assigned(consumer: Any) -> set[int]:
    return {tp.partition for tp in consumer.assignment()}


def test_confluent_two_consumers_share_partitions_then_one_takes_all(gateway: Gateway) -> None:
    create_topic(gateway, "cf-group", 4)
    sent = produce(gateway, "cf-group", 4, 5)
    a, b = confluent_consumer(gateway, "cf-g"), confluent_consumer(gateway, "cf-g")
    got: list[bytes] = []
    try:
        a.subscribe(["cf-group"])
        b.subscribe(["cf-group"])
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            for c in (a, b):
                m = c.poll(0.2)
                if m is not None and m.error() is None:
                    got.append(m.value())
                    c.commit(m, asynchronous=False)
            if len(_assigned(a)) == 2 and len(_assigned(b)) == 2:
                break
        assert _assigned(a) | _assigned(b) == {0, 1, 2, 3}, group_state(gateway, "cf-g")
        assert not _assigned(a) & _assigned(b)
        b.close()
        b = None
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline and (len(_assigned(a)) < 4 or len(set(got)) < 20):
            m = a.poll(0.2)
            if m is not None and m.error() is None:
                got.append(m.value())
                a.commit(m, asynchronous=False)
        assert _assigned(a) == {0, 1, 2, 3}, group_state(gateway, "cf-g")
    finally:
        a.close()
        if b is not None:  # (a failed assertion: its poll threads would outlive the module)
            b.close()
    assert set(got) == sent
    committed = cursors(gateway, "cf-g", [f"cf-group-{p}" for p in range(4)])
    assert committed == {f"cf-group-{p}": 5 for p in range(4)}
    # A new consumer of the group resumes at the committed offsets: only what is new.
    more = produce(gateway, "cf-group", 4, 2, "more")
    c = confluent_consumer(gateway, "cf-g")
    fresh: list[bytes] = []
    try:
        c.subscribe(["cf-group"])
        deadline = time.monotonic() + WAIT_S
        while len(fresh) < len(more) and time.monotonic() < deadline:
            m = c.poll(0.2)
            if m is not None and m.error() is None:
                fresh.append(m.value())
    finally:
        c.close()
    assert sorted(fresh) == sorted(more)


def test_a_member_gone_silent_in_a_rebalance_leaves_the_others_joined(gateway: Gateway) -> None:
    """A member whose session runs out while the others wait at the join barrier (a client
    that joined again under a new member id leaves its old one so): once it is removed the
    round completes with those waiting, not at their rebalance timeout (librdkafka's: five
    minutes)."""
    from estream.sdk.groups import GroupClient

    create_topic(gateway, "cf-silent", 2)

    async def silent_leader() -> None:  # leads generation 1, then is never heard from
        async with await estream.connect(gateway.pd) as sdk:
            joined = await GroupClient(sdk.pd).join(
                "cf-silent-g", "silent", "consumer", [("range", b"")],
                session_timeout_ms=1_000, rebalance_timeout_ms=1_000)
            assert not joined.error and joined.leader == "silent"

    asyncio.run(silent_leader())
    consumer = confluent_consumer(gateway, "cf-silent-g")
    try:
        consumer.subscribe(["cf-silent"])
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline and len(_assigned(consumer)) < 2:
            consumer.poll(0.2)
        assert _assigned(consumer) == {0, 1}, group_state(gateway, "cf-silent-g")
    finally:
        consumer.close()


async def test_a_join_is_answered_when_its_round_completed_though_the_next_one_opened(
        gateway: Gateway) -> None:
    """A member whose round completed at its own join, but which asks for the answer only
    after another member's join opened the next round, gets it (and learns of the next
    round from SyncGroup): its JoinGroup does not wait on a round that waits for it (the
    two confluent consumers' stall under load: both held in JoinGroup for minutes)."""
    from estream.sdk.groups import REBALANCING, GroupClient
    from estream.wire import groupmessages as gm
    from estream.wire.protocol import Opcode

    async with await estream.connect(gateway.pd) as sdk:
        async def join(member: str) -> gm.JoinAnswer:
            return gm.JoinAnswer.from_header(await sdk.pd.call(
                Opcode.PD_GROUP_JOIN, gm.JoinRequest(
                    group="late-g", member=member, protocol_type="consumer",
                    protocols=(("range", b""),), session_timeout_ms=10_000,
                    rebalance_timeout_ms=60_000).to_header()))

        first = await join("first")  # alone: its round completes at once
        await join("second")  # the next round opens before "first" asks
        got = gm.AwaitJoinAnswer.from_header(await sdk.pd.call(
            Opcode.PD_GROUP_AWAIT_JOIN, gm.MemberRequest(
                group="late-g", member="first", generation=first.generation).to_header()))
        assert (got.done, got.generation, got.leader) == (True, 1, "first")
        groups = GroupClient(sdk.pd)
        assert (await groups.sync("late-g", "first", 1, [("first", b"")], wait_s=5))[0] == (
            REBALANCING)
        await groups.leave("late-g", ["first", "second"])


async def test_a_member_whose_client_died_is_removed_though_nobody_calls(
        gateway: Gateway) -> None:
    """A member nobody hears from again is removed at its session's end though no call
    names its group (kill -9 of every consumer left the group Stable for good, and 10,000
    such groups refuse every new one)."""
    from estream.sdk.groups import GroupClient

    async with await estream.connect(gateway.pd) as sdk:
        groups = GroupClient(sdk.pd)
        joined = await groups.join("orphan-g", "crashed", "consumer", [("range", b"")],
                                   session_timeout_ms=1_000, rebalance_timeout_ms=1_000)
        assert not joined.error
        assert [m["member"] for m in (await groups.describe("orphan-g"))["members"]] == [
            "crashed"]
        deadline = time.monotonic() + WAIT_S
        while (await groups.describe("orphan-g"))["members"] and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        assert (await groups.describe("orphan-g"))["members"] == []


async def test_aiokafka_group_consumes_and_commits(gateway: Gateway) -> None:
    from aiokafka import AIOKafkaConsumer

    await asyncio.to_thread(create_topic, gateway, "aio-group", 2)
    sent = await asyncio.to_thread(produce, gateway, "aio-group", 2, 4)
    consumer = AIOKafkaConsumer("aio-group", bootstrap_servers=gateway.address,
                                group_id="aio-g", auto_offset_reset="earliest",
                                enable_auto_commit=False)
    await consumer.start()
    got: list[bytes] = []
    try:
        deadline = time.monotonic() + WAIT_S
        while len(got) < len(sent) and time.monotonic() < deadline:
            batches = await consumer.getmany(timeout_ms=500)
            got += [m.value for ms in batches.values() for m in ms]
        await consumer.commit()
    finally:
        await consumer.stop()
    assert sorted(got) == sorted(sent)
    async with await estream.connect(gateway.pd) as sdk:
        assert [await sdk.cursor_offset(f"aio-group-{p}", "aio-g") for p in range(2)] == [4, 4]


# -- hostile inputs, raw frames --------------------------------------------------------


def test_hostile_group_requests_get_kafka_error_codes_and_the_gateway_keeps_serving(
        gateway: Gateway) -> None:
    import datetime

    from kio.schema.errors import ErrorCode
    from kio.schema.heartbeat.v3.request import HeartbeatRequest
    from kio.schema.join_group.v5.request import JoinGroupRequest, JoinGroupRequestProtocol
    from kio.schema.offset_commit.v7.request import (
        OffsetCommitRequest,
        OffsetCommitRequestPartition,
        OffsetCommitRequestTopic,
    )
    from kio.schema.sync_group.v3.request import SyncGroupRequest
    from kio.schema.types import GroupId, TopicName
    from kio.static.primitive import i32, i32Timedelta, i64

    def ms(v: int) -> Any:
        return i32Timedelta.parse(datetime.timedelta(milliseconds=v))

    def join(group: str, member: str, metadata: bytes, session: int = 10_000) -> Any:
        return JoinGroupRequest(group_id=GroupId(group), session_timeout=ms(session),
                                rebalance_timeout=ms(5_000), member_id=member,
                                group_instance_id=None, protocol_type="consumer",
                                protocols=(JoinGroupRequestProtocol(name="range",
                                                                    metadata=metadata),))

    create_topic(gateway, "kp-twice", 1)
    host, port = gateway.address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=WAIT_S) as sock:
        # v4+: a first join gets MEMBER_ID_REQUIRED with the id to join with.
        first = call_on(sock, 11, 5, 1, join("hostile", "", b"m"))
        assert first.error_code == ErrorCode.member_id_required and first.member_id
        member = first.member_id
        # Absurd sizes: protocol metadata past the bound, a bad group name, a session
        # timeout out of range.
        huge = call_on(sock, 11, 5, 2, join("hostile", member, b"x" * (1024 * 1024)))
        assert huge.error_code == ErrorCode.invalid_request
        bad = call_on(sock, 11, 5, 3, join("no spaces!", member, b"m"))
        assert bad.error_code == ErrorCode.invalid_group_id
        late = call_on(sock, 11, 5, 4, join("hostile", member, b"m", session=2**31 - 1))
        assert late.error_code == ErrorCode.invalid_session_timeout
        joined = call_on(sock, 11, 5, 5, join("hostile", member, b"m"))
        assert joined.error_code == ErrorCode.none and joined.leader == member
        generation = int(joined.generation_id)
        synced = call_on(sock, 14, 3, 6, SyncGroupRequest(
            group_id=GroupId("hostile"), generation_id=i32(generation), member_id=member,
            group_instance_id=None, assignments=()))
        assert synced.error_code == ErrorCode.none
        # Unknown members and wrong generations.
        for corr, (who, gen, code) in enumerate([
                ("nobody", generation, ErrorCode.unknown_member_id),
                (member, generation + 7, ErrorCode.illegal_generation),
                (member, generation, ErrorCode.none)], start=10):
            beat = call_on(sock, 12, 3, corr, HeartbeatRequest(
                group_id=GroupId("hostile"), generation_id=i32(gen), member_id=who,
                group_instance_id=None))
            assert beat.error_code == code, (who, gen)
        commit = call_on(sock, 8, 7, 20, OffsetCommitRequest(
            group_id=GroupId("hostile"), generation_id_or_member_epoch=i32(generation + 1),
            member_id=member,
            group_instance_id=None, topics=(OffsetCommitRequestTopic(
                name=TopicName("kp-group"), partitions=(OffsetCommitRequestPartition(
                    partition_index=i32(0), committed_offset=i64(1),
                    committed_leader_epoch=i32(-1), committed_metadata=None),)),)))
        assert commit.topics[0].partitions[0].error_code == ErrorCode.illegal_generation
        # The gateway still serves: the member commits in its generation.
        commit = call_on(sock, 8, 7, 21, OffsetCommitRequest(
            group_id=GroupId("hostile"), generation_id_or_member_epoch=i32(generation),
            member_id=member,
            group_instance_id=None, topics=(OffsetCommitRequestTopic(
                name=TopicName("no-such-topic"), partitions=(OffsetCommitRequestPartition(
                    partition_index=i32(0), committed_offset=i64(1),
                    committed_leader_epoch=i32(-1), committed_metadata=None),)),)))
        assert commit.topics[0].partitions[0].error_code == ErrorCode.unknown_topic_or_partition
        # One partition named twice: neither offset is committed, each entry says so (both
        # were answered with the code of the last one, committed).
        commit = call_on(sock, 8, 7, 22, OffsetCommitRequest(
            group_id=GroupId("hostile"), generation_id_or_member_epoch=i32(generation),
            member_id=member,
            group_instance_id=None, topics=(OffsetCommitRequestTopic(
                name=TopicName("kp-twice"), partitions=tuple(OffsetCommitRequestPartition(
                    partition_index=i32(0), committed_offset=i64(offset),
                    committed_leader_epoch=i32(-1), committed_metadata=None)
                    for offset in (10**9, 1))),)))
        assert [p.error_code for p in commit.topics[0].partitions] == [
            ErrorCode.invalid_request] * 2
        assert cursors(gateway, "hostile", ["kp-twice-0"]) == {"kp-twice-0": None}


def test_a_pd_leader_change_mid_group_loses_no_committed_offset(
        gateway: Gateway, module_cluster: Any) -> None:
    create_topic(gateway, "pd-flip", 2)
    sent = produce(gateway, "pd-flip", 2, 6)
    c = confluent_consumer(gateway, "flip-g")
    got: list[bytes] = []
    try:
        c.subscribe(["pd-flip"])
        deadline = time.monotonic() + WAIT_S
        while len(got) < 6 and time.monotonic() < deadline:
            m = c.poll(0.2)
            if m is not None and m.error() is None:
                got.append(m.value())
                c.commit(m, asynchronous=False)
        before = cursors(gateway, "flip-g", ["pd-flip-0", "pd-flip-1"])
        leader = module_cluster.kill_pd_leader()
        try:
            deadline = time.monotonic() + WAIT_S
            while len(got) < len(sent) and time.monotonic() < deadline:
                m = c.poll(0.2)
                if m is not None and m.error() is None:
                    got.append(m.value())
                    c.commit(m, asynchronous=False)
        finally:
            module_cluster.restart_pd(leader)
    finally:
        c.close()
    assert set(got) == sent
    after = cursors(gateway, "flip-g", ["pd-flip-0", "pd-flip-1"])
    assert all((after[s] or 0) >= (before[s] or 0) for s in after)
    assert after == {"pd-flip-0": 6, "pd-flip-1": 6}


async def test_sdk_subscribe_shares_streams_rebalances_and_resumes(gateway: Gateway) -> None:
    names = [f"sdk-sub-{p}" for p in range(3)]

    async def until(check: Any) -> None:
        deadline = time.monotonic() + WAIT_S
        while not check():
            assert time.monotonic() < deadline
            await asyncio.sleep(0.1)

    async with await estream.connect(gateway.pd) as sdk:
        writers = []
        for name in names:
            await sdk.create_stream(name)
            writers.append(await sdk.open_writer(name))

        async def write(tag: str) -> set[bytes]:
            values = {f"{name}/{tag}{i}".encode() for name in names for i in range(4)}
            for name, writer in zip(names, writers, strict=True):
                for i in range(4):
                    await writer.append(f"{name}/{tag}{i}".encode())
            return values

        sent = await write("a")
        a = sdk.subscribe("sdk-g", names, heartbeat_s=0.2)
        b = sdk.subscribe("sdk-g", names, heartbeat_s=0.2)
        got: list[bytes] = []

        async def consume(sub: Any) -> None:
            async for item in sub:
                got.append(item.record.value)
                await sub.commit()

        tasks = [asyncio.ensure_future(consume(a)), asyncio.ensure_future(consume(b))]
        try:
            await until(lambda: set(got) == sent)
            await until(lambda: a.assignment and b.assignment
                        and not set(a.assignment) & set(b.assignment))
            assert set(a.assignment) | set(b.assignment) == set(names)
            sent |= await write("b")
            await until(lambda: set(got) == sent)
            await b.close()  # b leaves: a takes every stream
            await until(lambda: set(a.assignment) == set(names))
            sent |= await write("c")
            await until(lambda: set(got) == sent)
        finally:
            await a.close()
            await b.close()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for writer in writers:
                await writer.close()
        assert [await sdk.cursor_offset(n, "sdk-g") for n in names] == [12, 12, 12]


async def test_sdk_subscribe_to_a_kafka_groups_name_raises_instead_of_waiting(
        gateway: Gateway) -> None:
    """A group is either Kafka consumers' or ``client.subscribe``'s: subscribing to a name a
    Kafka group holds raises ``Conflict`` naming why (it asked again every 0.2 s, silently,
    for as long as the Kafka group lived)."""
    from estream.sdk.groups import GroupClient

    async with await estream.connect(gateway.pd) as sdk:
        await sdk.create_stream("mixed-s")
        groups = GroupClient(sdk.pd)
        joined = await groups.join("mixed-g", "kafka-member", "consumer", [("range", b"")],
                                   session_timeout_ms=60_000, rebalance_timeout_ms=1_000)
        assert not joined.error
        sub = sdk.subscribe("mixed-g", ["mixed-s"], heartbeat_s=0.2)
        try:
            with pytest.raises(estream.Conflict, match="inconsistent_group_protocol"):
                async with asyncio.timeout(WAIT_S):
                    await sub.__anext__()
        finally:
            await sub.close()
            await groups.leave("mixed-g", ["kafka-member"])


async def test_sdk_subscribe_reads_a_stream_deleted_and_made_again(gateway: Gateway) -> None:
    """A member's stream is deleted and made again under its name: its tail ends
    (StreamNotFound), the member joins again and reads the new stream from its start.
    Before, the ended tail was dropped silently and the subscription waited forever."""
    async with await estream.connect(gateway.pd) as sdk:
        await sdk.create_stream("sdk-reborn")
        async with await sdk.open_writer("sdk-reborn") as writer:
            for i in range(3):
                await writer.append(b"old-%d" % i)
        got: list[tuple[int, bytes]] = []
        async with sdk.subscribe("sdk-reborn-g", ["sdk-reborn"], heartbeat_s=0.2) as sub:

            async def take(count: int) -> None:
                async for item in sub:
                    got.append((item.record.offset, item.record.value))
                    if len(got) == count:
                        return

            await asyncio.wait_for(take(3), WAIT_S)
            await sub.commit()
            await sdk.delete_stream("sdk-reborn")
            await sdk.create_stream("sdk-reborn")
            async with await sdk.open_writer("sdk-reborn") as writer:
                for i in range(2):
                    await writer.append(b"new-%d" % i)
            await asyncio.wait_for(take(5), WAIT_S)
        assert got == [(0, b"old-0"), (1, b"old-1"), (2, b"old-2"), (0, b"new-0"), (1, b"new-1")]


async def test_a_group_commit_read_from_a_deleted_stream_is_refused(gateway: Gateway) -> None:
    """A member read a stream, which is deleted and made again before its commit: the
    commit names the stream id it read, so PD refuses it (``unknown_topic_or_partition``)
    and the new stream keeps no cursor; a commit naming the new id, or none, is taken."""
    from estream.sdk.groups import GroupClient

    async with await estream.connect(gateway.pd) as sdk:
        old = await sdk.create_stream("commit-reborn")
        await sdk.delete_stream("commit-reborn")
        new = await sdk.create_stream("commit-reborn")
        groups = GroupClient(sdk.pd)
        stale = await groups.commit("commit-reborn-g", {"commit-reborn": 0},
                                    ids={"commit-reborn": old.id})
        assert stale == {"commit-reborn": "unknown_topic_or_partition"}
        assert await sdk.cursor_offset("commit-reborn", "commit-reborn-g") is None
        assert await groups.commit("commit-reborn-g", {"commit-reborn": 0},
                                   ids={"commit-reborn": new.id}) == {"commit-reborn": ""}
        assert await sdk.cursor_offset("commit-reborn", "commit-reborn-g") == 0


async def test_sdk_subscribe_to_a_stream_deleted_for_good_rebalances_nothing(
        gateway: Gateway) -> None:
    """A member's stream is deleted and not made again: the member waits for the name
    (looked up every gone_poll_s) instead of joining again and again, and keeps
    delivering its other stream in the same generation."""
    async with await estream.connect(gateway.pd) as sdk:
        for name in ("gone-a", "gone-b"):
            await sdk.create_stream(name)
        async with sdk.subscribe("gone-g", ["gone-a", "gone-b"], heartbeat_s=0.2) as sub:
            async with await sdk.open_writer("gone-b") as writer:
                await writer.append(b"b-0")
                it = aiter(sub)
                first = await asyncio.wait_for(anext(it), WAIT_S)
                generation = sub.generation
                await sdk.delete_stream("gone-a")
                await asyncio.sleep(1.5)  # about seven rejoins at rejoin_pause_s before
                await writer.append(b"b-1")
                second = await asyncio.wait_for(anext(it), WAIT_S)
        assert [first.record.value, second.record.value] == [b"b-0", b"b-1"]
        assert sub.generation == generation


def commit_from_partition_0(consumer: Any, topic: str, count: int) -> None:
    """Subscribe ``consumer`` (a confluent-kafka one) to ``topic`` and consume, committing
    each, ``count`` records of its partition 0 (within WAIT_S)."""
    consumer.subscribe([topic])
    got = 0
    deadline = time.monotonic() + WAIT_S
    while got < count and time.monotonic() < deadline:
        m = consumer.poll(0.2)
        if m is not None and m.error() is None and m.partition() == 0:
            got += 1
            consumer.commit(m, asynchronous=False)


def test_cli_and_admin_api_show_a_group_its_members_offsets_and_lag(
        gateway: Gateway, module_cluster: Any) -> None:
    import json
    import subprocess
    import sys
    import urllib.request

    create_topic(gateway, "ops-t", 2)
    produce(gateway, "ops-t", 2, 3)
    c = confluent_consumer(gateway, "ops-g")
    try:
        commit_from_partition_0(c, "ops-t", 2)
        ran = subprocess.run(
            [sys.executable, "-m", "estream.cli.main", "group", "describe", "ops-g", "--json",
             "--pd", gateway.pd], capture_output=True, text=True, timeout=60, check=False,
            cwd=Path(__file__).resolve().parents[2])
        assert ran.returncode == 0, ran.stderr
        shown = json.loads(ran.stdout)
        assert shown["state"] == "Stable" and len(shown["members"]) == 1
        assert shown["members"][0]["client_id"] == "rdkafka"  # librdkafka's default
        assert sorted(shown["members"][0]["streams"]) == ["ops-t-0", "ops-t-1"]
        assert {"stream": "ops-t-0", "offset": 2, "end": 3, "lag": 1} in shown["offsets"]
        with urllib.request.urlopen(f"{module_cluster.pd_url()}/v1/groups", timeout=20) as r:
            listed = json.loads(r.read())["groups"]
        assert {"group": "ops-g", "state": "Stable", "protocol_type": "consumer",
                "members": 1} in listed
        with urllib.request.urlopen(f"{module_cluster.pd_url()}/v1/groups/ops-g",
                                    timeout=20) as r:
            assert json.loads(r.read())["offsets"] == shown["offsets"]
    finally:
        c.close()


def test_the_gateway_metrics_show_a_groups_lag_per_partition(gateway: Gateway) -> None:
    """``estream_kafka_group_lag{group,topic,partition}``: the partition's end minus the
    group's committed offset, for a group of a real consumer; the exposition passes
    ``promtool check metrics``."""
    import re
    import subprocess
    import urllib.request

    from confluent_kafka import TopicPartition

    from tests.system_tools import require_tool

    promtool = require_tool("promtool", package="prometheus")  # CI: missing fails
    create_topic(gateway, "lag-t", 2)
    produce(gateway, "lag-t", 2, 5)
    c = confluent_consumer(gateway, "lag-g")
    try:
        commit_from_partition_0(c, "lag-t", 2)
        c.commit(offsets=[TopicPartition("lag-t", 1, 5)], asynchronous=False)
        with urllib.request.urlopen(f"http://{gateway.http}/metrics", timeout=WAIT_S) as r:
            text = r.read()
    finally:
        c.close()
    lags = {m[0]: float(m[1]) for m in re.findall(
        rb'estream_kafka_group_lag\{group="lag-g",(partition="\d",topic="lag-t")\} (\S+)',
        text)}
    assert lags == {b'partition="0",topic="lag-t"': 3.0, b'partition="1",topic="lag-t"': 0.0}
    assert b'estream_kafka_group_lag_omitted{what="series"} 0.0' in text
    checked = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True,
                             timeout=30, check=False)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_a_deleted_topic_takes_its_offsets_and_a_name_reused_starts_clean(
        gateway: Gateway) -> None:
    from confluent_kafka import TopicPartition
    from kafka.admin import KafkaAdminClient

    create_topic(gateway, "reused-t", 1)
    produce(gateway, "reused-t", 1, 3)
    c = confluent_consumer(gateway, "reused-g")
    try:
        c.commit(offsets=[TopicPartition("reused-t", 0, 3)], asynchronous=False)
        [found] = c.committed([TopicPartition("reused-t", 0)], timeout=WAIT_S)
        assert found.offset == 3
        client = KafkaAdminClient(bootstrap_servers=gateway.address, request_timeout_ms=20_000)
        try:
            client.delete_topics(["reused-t"])
        finally:
            client.close()
        create_topic(gateway, "reused-t", 1)
        [found] = c.committed([TopicPartition("reused-t", 0)], timeout=WAIT_S)
        assert found.offset < 0  # no committed offset: the old one went with its stream
    finally:
        c.close()
    assert cursors(gateway, "reused-g", ["reused-t-0"]) == {"reused-t-0": None}


def test_a_join_waits_at_the_barrier_without_blocking_other_connections(
        gateway: Gateway) -> None:
    import datetime

    from kio.schema.api_versions.v0.request import ApiVersionsRequest
    from kio.schema.errors import ErrorCode
    from kio.schema.heartbeat.v3.request import HeartbeatRequest
    from kio.schema.join_group.v5.request import JoinGroupRequest, JoinGroupRequestProtocol
    from kio.schema.sync_group.v3.request import SyncGroupRequest
    from kio.schema.types import GroupId
    from kio.static.primitive import i32, i32Timedelta

    def join(member: str) -> Any:
        ms = i32Timedelta.parse(datetime.timedelta(milliseconds=10_000))
        return JoinGroupRequest(group_id=GroupId("barrier"), session_timeout=ms,
                                rebalance_timeout=ms, member_id=member,
                                group_instance_id=None, protocol_type="consumer",
                                protocols=(JoinGroupRequestProtocol(name="range",
                                                                    metadata=b""),))

    host, port = gateway.address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=WAIT_S) as a, \
            socket.create_connection((host, int(port)), timeout=WAIT_S) as b:
        first = call_on(a, 11, 5, 1, join("")).member_id
        joined = call_on(a, 11, 5, 2, join(first))
        generation = int(joined.generation_id)
        assert call_on(a, 14, 3, 3, SyncGroupRequest(
            group_id=GroupId("barrier"), generation_id=i32(generation), member_id=first,
            group_instance_id=None, assignments=())).error_code == ErrorCode.none
        second = call_on(b, 11, 5, 4, join("")).member_id
        b.sendall(frame(11, 5, 5, join(second)))  # waits at the barrier for the first
        deadline = time.monotonic() + WAIT_S
        code = ErrorCode.none
        while code == ErrorCode.none and time.monotonic() < deadline:
            code = call_on(a, 12, 3, 6, HeartbeatRequest(
                group_id=GroupId("barrier"), generation_id=i32(generation), member_id=first,
                group_instance_id=None)).error_code
        assert code == ErrorCode.rebalance_in_progress
        started = time.monotonic()
        assert call_on(a, 18, 0, 7, ApiVersionsRequest()).error_code == ErrorCode.none
        assert time.monotonic() - started < 5  # the other member's wait holds nothing here
        rejoined = call_on(a, 11, 5, 8, join(first))  # the round completes: both joined
        assert rejoined.error_code == ErrorCode.none
        assert int(rejoined.generation_id) == generation + 1 and len(rejoined.members) == 2
        size = struct.unpack(">i", read_exactly(b, 4))[0]
        from kio.index import load_response_schema
        from kio.serial import entity_reader

        answer, _ = entity_reader(load_response_schema(11, 5))(read_exactly(b, size), 4)
        assert answer.error_code == ErrorCode.none and answer.leader == first
        assert int(answer.generation_id) == generation + 1 and answer.members == ()


def test_kafka_python_admin_lists_describes_fetches_and_deletes_group_offsets(
        gateway: Gateway) -> None:
    from kafka.admin import KafkaAdminClient
    from kafka.structs import TopicPartition

    create_topic(gateway, "adm-t", 1)
    produce(gateway, "adm-t", 1, 2)
    c = confluent_consumer(gateway, "adm-g")
    admin = KafkaAdminClient(bootstrap_servers=gateway.address, request_timeout_ms=20_000)
    try:
        c.subscribe(["adm-t"])
        deadline = time.monotonic() + WAIT_S
        got = 0
        while got < 2 and time.monotonic() < deadline:
            m = c.poll(0.2)
            if m is not None and m.error() is None:
                got += 1
                c.commit(m, asynchronous=False)
        listed = str(admin.list_groups())
        assert "adm-g" in listed and "consumer" in listed
        described = str(admin.describe_groups(["adm-g"]))
        assert "Stable" in described and "range" in described
        offsets = str(admin.list_group_offsets({"adm-g": None}))
        assert "adm-t" in offsets and "2" in offsets
        c.close()
        admin.delete_group_offsets("adm-g", [TopicPartition("adm-t", 0)])
        assert cursors(gateway, "adm-g", ["adm-t-0"]) == {"adm-t-0": None}
    finally:
        admin.close()
        c.close()


def _in_flight(gateway: Gateway) -> float:
    import re
    import urllib.request

    with urllib.request.urlopen(f"http://{gateway.http}/metrics", timeout=WAIT_S) as r:
        found = re.search(rb"^estream_kafka_requests_in_flight (\S+)$", r.read(), re.M)
    assert found, "no estream_kafka_requests_in_flight in /metrics"
    return float(found.group(1))


def test_a_join_waiting_at_the_barrier_ends_when_its_connection_closes(
        gateway: Gateway) -> None:
    """Issue 31: the gateway never cancelled a request's task when its connection closed,
    so a JoinGroup kept waiting at its barrier (up to 300 s) for nobody. A member's join
    waits for the other member's rejoin (60 s rebalance timeout); its socket closes: the
    request ends within seconds, and the group is not stuck (the other member rejoins and
    the round completes, the gone member in it until its session times out)."""
    import datetime

    from kio.schema.errors import ErrorCode
    from kio.schema.join_group.v5.request import JoinGroupRequest, JoinGroupRequestProtocol
    from kio.schema.sync_group.v3.request import SyncGroupRequest
    from kio.schema.types import GroupId
    from kio.static.primitive import i32, i32Timedelta

    def join(member: str) -> Any:
        def ms(v: int) -> Any:
            return i32Timedelta.parse(datetime.timedelta(milliseconds=v))
        return JoinGroupRequest(group_id=GroupId("closed-mid-join"), session_timeout=ms(30_000),
                                rebalance_timeout=ms(60_000), member_id=member,
                                group_instance_id=None, protocol_type="consumer",
                                protocols=(JoinGroupRequestProtocol(name="range",
                                                                    metadata=b""),))

    host, port = gateway.address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=WAIT_S) as a:
        first = call_on(a, 11, 5, 1, join("")).member_id
        joined = call_on(a, 11, 5, 2, join(first))
        generation = int(joined.generation_id)
        assert call_on(a, 14, 3, 3, SyncGroupRequest(
            group_id=GroupId("closed-mid-join"), generation_id=i32(generation),
            member_id=first, group_instance_id=None, assignments=())).error_code == \
            ErrorCode.none
        with socket.create_connection((host, int(port)), timeout=WAIT_S) as b:
            second = call_on(b, 11, 5, 4, join("")).member_id
            b.sendall(frame(11, 5, 5, join(second)))  # waits at the barrier for `first`
            deadline = time.monotonic() + WAIT_S
            while _in_flight(gateway) < 1 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert _in_flight(gateway) >= 1, "the join is not waiting at the barrier"
        closed = time.monotonic()  # b's socket is closed, its join unanswered
        while _in_flight(gateway) > 0 and time.monotonic() < closed + WAIT_S:
            time.sleep(0.05)
        ended_s = time.monotonic() - closed
        assert ended_s < 5, f"the closed connection's join still waited {ended_s:.1f}s"
        rejoined = call_on(a, 11, 5, 6, join(first))  # the round completes without b's answer
        assert rejoined.error_code == ErrorCode.none
        assert int(rejoined.generation_id) == generation + 1 and len(rejoined.members) == 2
