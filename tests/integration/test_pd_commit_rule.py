"""The PD commit rule, in-process with three Raft nodes: a command is acknowledged only once
it is synced on a majority that includes the leader; the leader's sync runs while its
followers receive the entries; a follower never cuts entries it synced and acknowledged
when the leader resends them; a failed sync stops the node; what was acknowledged survives
a power loss of every node (each journal cut to what its syncs covered), and a read after
the leader died sees it."""

from __future__ import annotations

import asyncio
import math
import shutil
import threading
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from pysyncobj.monotonic import monotonic as raft_clock  # its election deadlines' clock

from estream.devcluster.process import free_port
from estream.wire.errors import EstreamError, Timeout, Unavailable
from estream.wire.meta import StreamMeta
from pd.commands import CreateStream, RegisterServer
from pd.shell import raftpatch
from pd.shell.journal import ChecksummedJournal
from pd.shell.raft import RaftNode
from pd.shell.raftwire import RaftConnection

pytestmark = pytest.mark.integration


def _journal(node: RaftNode) -> ChecksummedJournal:
    journal = raftpatch.raft_log(node._sync)
    assert isinstance(journal, ChecksummedJournal)
    return journal


def _start(addresses: list[str], root: Path, password: str | None = None) -> list[RaftNode]:
    """Start a node per address: a new cluster's first start (``new_cluster``; ignored by
    a node whose data dir holds a catalog)."""
    nodes = []
    for i, address in enumerate(addresses):
        node = RaftNode(address, [a for a in addresses if a != address], root / f"n{i}",
                        password=password, propose_timeout_s=3.0, new_cluster=True)
        node.start()
        nodes.append(node)
    return nodes


async def _leader(nodes: list[RaftNode], timeout_s: float = 10.0) -> RaftNode:
    deadline = time.monotonic() + timeout_s
    while True:
        leaders = [n for n in nodes if not n.failed and n.status().role == "leader"
                   and n.leader() == n.self_address]
        if len(leaders) == 1 and all(n.leader() == leaders[0].self_address
                                     for n in nodes if not n.failed):
            return leaders[0]
        assert time.monotonic() < deadline, "no leader"
        await asyncio.sleep(0.05)


def _pin(leader: RaftNode, followers: list[RaftNode]) -> None:
    """Keep ``leader`` the leader for the test: under a loaded CPU a starved tick thread
    would let a follower's election timer expire, and the test's ``leader`` and
    ``followers`` would name the wrong nodes."""
    for follower in followers:
        conf = follower._sync.conf
        conf.raftMinTimeout, conf.raftMaxTimeout = 60.0, 61.0
        raftpatch.set_election_deadline(follower._sync, raft_clock() + 60.0)
    leader._sync.conf.leaderFallbackTimeout = 60.0


def _pinned_leader_term(leader: RaftNode) -> tuple[bool, int]:
    return bool(leader._sync._isLeader()), int(leader._sync.raftCurrentTerm)


async def _until(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


@pytest.fixture
async def three(tmp_path: Path) -> AsyncIterator[list[RaftNode]]:
    addresses = [f"127.0.0.1:{free_port()}" for _ in range(3)]
    nodes = _start(addresses, tmp_path)
    try:
        yield nodes
    finally:
        for node in nodes:
            await asyncio.to_thread(node.close)


def _delayed(real: Callable[[int], None], seconds: float) -> Callable[[int], None]:
    def sync(fd: int) -> None:
        time.sleep(seconds)
        real(fd)
    return sync


def _create(i: int) -> CreateStream:
    return CreateStream(f"s{i}", 1, 1, "", (), ("rs1",), f"r{i}")


async def test_an_acknowledged_command_is_synced_on_the_leader_and_a_follower(
        three: list[RaftNode]) -> None:
    leader = await _leader(three)
    followers = [n for n in three if n is not leader]
    _pin(leader, followers)
    term = _pinned_leader_term(leader)
    await leader.propose(RegisterServer("rs1", "127.0.0.1:9", "ssd"))

    async def one(i: int) -> None:
        node = leader if i % 3 else followers[0]  # some through a follower
        await node.propose(_create(i))
        committed = leader._sync.raftCommitIndex
        # read after the commit index: a durable index only grows (a journal is cut only
        # at a conflict, and the pinned leader's entries conflict with none)
        assert _journal(leader).durable_index >= committed
        assert any(_journal(f).durable_index >= committed for f in followers)

    # The followers' disks are slow: an acknowledgement sent before their sync would show.
    real = {id(n): _journal(n).fdatasync for n in three}
    for follower in followers:
        _journal(follower).fdatasync = _delayed(real[id(follower)], 0.03)
    await asyncio.gather(*(one(i) for i in range(15)))
    for follower in followers:
        _journal(follower).fdatasync = real[id(follower)]
    # The leader's disk is slow: it counts itself only once synced, and its followers
    # receive the entries meanwhile (the two syncs overlap).
    slow_leader = _journal(leader)
    overlapped: list[bool] = []

    def slow(fd: int) -> None:
        syncing = slow_leader[-1][1]
        time.sleep(0.05)
        overlapped.append(any(_journal(f)[-1][1] >= syncing for f in followers))
        real[id(leader)](fd)

    slow_leader.fdatasync = slow
    await asyncio.gather(*(one(i) for i in range(15, 30)))
    assert all(name in leader.view().streams for name in (f"s{i}" for i in range(30)))
    assert any(overlapped), "the leader's sync never overlapped its followers' receipt"
    assert term[0] and _pinned_leader_term(leader) == term  # still the leader, same term


async def test_a_lone_proposal_is_synced_on_the_leaders_loop_and_a_burst_on_its_thread(
        three: list[RaftNode]) -> None:
    """One proposal at a time (the last one older than proposal_batch_s): the leader syncs
    its journal on the event loop right after sending the entries (no hand-over to the
    sync thread and back), and still acknowledges only what is synced on it and a
    follower. Proposals together: one sync on the sync thread, the loop free meanwhile."""
    leader = await _leader(three)
    followers = [n for n in three if n is not leader]
    _pin(leader, followers)
    await leader.propose(RegisterServer("rs1", "127.0.0.1:9", "ssd"))
    journal = _journal(leader)
    real = journal.fdatasync
    synced_on: list[int] = []

    def sync(fd: int) -> None:
        synced_on.append(threading.get_ident())
        real(fd)

    journal.fdatasync = sync
    loop_thread = threading.get_ident()
    for i in range(5):
        await asyncio.sleep(0.005)  # alone: the last proposal 5 ms ago
        synced_on.clear()
        await leader.propose(_create(i))
        assert synced_on and set(synced_on) == {loop_thread}
        committed = leader._sync.raftCommitIndex
        assert journal.durable_index >= committed
        assert any(_journal(f).durable_index >= committed for f in followers)
    synced_on.clear()
    await asyncio.gather(*(leader.propose(_create(i)) for i in range(5, 25)))
    assert any(thread != loop_thread for thread in synced_on)
    assert all(f"s{i}" in leader.view().streams for i in range(25))


async def test_the_answer_leaves_before_the_commit_index_and_followers_still_learn_it(
        tmp_path: Path) -> None:
    """With a password (pd/shell/raftwire.py on every connection): the leader answers a
    proposal before it tells its followers the new commit index (the answer does not wait
    for those messages), and the followers still learn every commit without another
    proposal."""
    addresses = [f"127.0.0.1:{free_port()}" for _ in range(3)]
    nodes = _start(addresses, tmp_path, password="the-cluster-secret")
    try:
        leader = await _leader(nodes)
        followers = [n for n in nodes if n is not leader]
        _pin(leader, followers)
        await leader.propose(RegisterServer("rs1", "127.0.0.1:9", "ssd"))
        sent: list[int] = []  # commit indexes the leader sent
        real_send = leader._sync._send_direct

        def send(node: object, message: dict[str, object]) -> object:
            if message.get("type") == "append_entries":
                sent.append(int(message["commit_index"]))  # type: ignore[call-overload]
            return real_send(node, message)

        leader._sync._send_direct = send
        answered_first = 0
        for i in range(20):
            await leader.propose(_create(i))
            index = leader._sync.raftCommitIndex
            answered_first += not any(c >= index for c in sent)
            await _until(lambda at=index: all(f._sync.raftLastApplied >= at for f in followers),
                         5.0)
        assert answered_first > 0, "every answer waited for the commit index to be sent"
        assert all(f"s{i}" in f.view().streams for f in followers for i in range(20))
        transport = raftpatch.transport(leader._sync)
        assert all(isinstance(c, RaftConnection) and c._sent > 0
                   for c in transport._connections.values())
    finally:
        for node in nodes:
            await asyncio.to_thread(node.close)


async def test_a_commit_index_alone_rides_on_the_next_append(three: list[RaftNode]) -> None:
    """Proposals one after another: the commit index of one goes to each follower inside
    the next one's append_entries (one message, one wake-up per follower and commit); the
    last one's goes alone after commit_hold_s, and every follower applies everything."""
    leader = await _leader(three)
    followers = [n for n in three if n is not leader]
    _pin(leader, followers)
    await leader.propose(RegisterServer("rs1", "127.0.0.1:9", "ssd"))
    await _until(lambda: not leader._sync._held)
    appends: list[bool] = []  # per append_entries the leader sent: did it carry entries?
    real_send = leader._sync._send_direct

    def send(node: object, message: dict[str, object]) -> object:
        if message.get("type") == "append_entries":
            appends.append(bool(message.get("entries")))
        return real_send(node, message)

    leader._sync._send_direct = send
    started = time.monotonic()
    for i in range(30):
        await leader.propose(_create(i))
    # Heartbeats (empty appends every 0.1 s to each follower) come on top, more of them
    # the slower the machine; a commit index sent alone per commit would be 60 more. A
    # commit index also goes alone when the next proposal comes more than commit_hold_s
    # (2 ms) after it, which a pause of this process (GC, the Raft threads) causes now
    # and then (CI saw 6 of 30): at most half the commits' worth, not all of them.
    heartbeats = 2 * math.ceil((time.monotonic() - started) / 0.1)
    with_entries = sum(appends)
    assert with_entries >= 60  # each proposal's entry to both followers
    assert len(appends) - with_entries <= 30 + heartbeats, appends  # not one per commit
    index = leader._sync.raftCommitIndex
    await _until(lambda: all(f._sync.raftLastApplied >= index for f in followers), 2.0)
    assert all(f"s{i}" in f.view().streams for f in followers for i in range(30))


async def _read(node: RaftNode) -> set[str]:
    """The stream names a client retrying on Unavailable reads from ``node``."""
    deadline = time.monotonic() + 10.0
    while True:
        try:
            await node.read_barrier()
            return set(node.view().streams)
        except Unavailable:
            assert time.monotonic() < deadline, "no read answered"
            await asyncio.sleep(0.05)


def _elect_soon(nodes: list[RaftNode], first: RaftNode) -> None:
    """Undo :func:`_pin` on ``nodes``; ``first`` stands for election at once."""
    for node in nodes:
        conf = node._sync.conf
        conf.raftMinTimeout, conf.raftMaxTimeout = 0.4, 1.2
        raftpatch.set_election_deadline(node._sync, raft_clock() + (
            0.0 if node is first else 2.0))


async def _settled(three: list[RaftNode]) -> tuple[RaftNode, list[RaftNode], int]:
    """The pinned leader, its followers, and the commit index every node applied (one
    command committed)."""
    leader = await _leader(three)
    followers = [n for n in three if n is not leader]
    _pin(leader, followers)
    await leader.propose(RegisterServer("rs1", "127.0.0.1:9", "ssd"))
    index = int(leader._sync.raftCommitIndex)
    await _until(lambda: all(f._sync.raftLastApplied >= index for f in followers))
    return leader, followers, index


async def test_a_read_after_the_leader_dies_sees_what_it_acknowledged(
        three: list[RaftNode]) -> None:
    """The leader acknowledges a command and dies before any follower learned that it was
    committed (they hold it, not applied): a read on a follower waits, then answers
    Unavailable or, once the new leader's first commit told it, with the command applied;
    never the catalog without it (RaftNode.read_barrier). The new leader reads only once
    it applied the first entry of its own term."""
    leader, followers, index = await _settled(three)
    real_send = leader._sync._send_direct

    def send(node: object, message: dict[str, object]) -> object:
        if message.get("type") == "append_entries" and not message.get("entries"):
            return True  # a commit index alone never leaves: no follower learns the commit
        return real_send(node, message)

    leader._sync._send_direct = send
    await leader.propose(_create(1))  # acknowledged
    assert all("s1" not in f.view().streams for f in followers)  # held, not applied
    waiting = asyncio.ensure_future(followers[0].read_barrier())
    await asyncio.sleep(0.2)
    assert not waiting.done()
    await asyncio.to_thread(leader.close)
    _elect_soon(followers, followers[0])
    try:
        await waiting
        assert "s1" in followers[0].view().streams  # a new leader committed in time
    except Unavailable as exc:
        assert "could not learn" in str(exc)  # after read_wait_s: the client asks again
    for follower in followers:
        assert "s1" in await _read(follower)
    new_leader = await _leader(followers)
    assert new_leader._sync.current()  # it applied its own term's first entry
    assert all(f._sync.raftLastApplied > index + 1 for f in followers)  # s1, then the no-op


async def test_a_follower_cut_off_from_a_dead_leader_reads_what_it_acknowledged(
        three: list[RaftNode]) -> None:
    """Two faults: one follower hears nothing from the leader (its messages lost), the
    leader acknowledges a command with the other one and dies. The cut-off follower lacks
    the command and does not know; a read on it waits until a leader of a new term (the
    other follower, with its vote) brought it everything, never answering without it."""
    leader, followers, index = await _settled(three)
    informed, cut_off = followers
    real_send = leader._sync._send_direct

    def send(node: object, message: dict[str, object]) -> object:
        if str(getattr(node, "address", node)) == cut_off.self_address:
            return True  # lost on the way
        return real_send(node, message)

    leader._sync._send_direct = send
    await leader.propose(_create(1))  # acknowledged by the leader and `informed`
    await asyncio.sleep(0.4)  # past leader_contact_s since `cut_off` last heard the leader
    assert "s1" not in cut_off.view().streams and cut_off._sync.log_end() == index
    waiting = asyncio.ensure_future(_read(cut_off))
    await asyncio.sleep(0.1)
    assert not waiting.done()
    await asyncio.to_thread(leader.close)
    _elect_soon(followers, informed)
    assert "s1" in await waiting
    assert (await _leader(followers)) is informed


@pytest.mark.parametrize("small_batches", [False, True])
async def test_a_follower_keeps_the_synced_entries_a_leader_resends(
        three: list[RaftNode], small_batches: bool) -> None:
    """pysyncobj's leader resends entries a follower already holds (a late acknowledgement
    lowers its next index; forced here), and its follower cut its log after the message's
    ``prevLogIdx`` and wrote them again: entries it had synced and acknowledged, counted in
    the leader's majority, were not durable until its next sync (with small batches, the
    entries after the message's were cut too). The follower must cut nothing."""
    leader = await _leader(three)
    followers = [n for n in three if n is not leader]
    _pin(leader, followers)
    target = followers[0]
    await leader.propose(RegisterServer("rs1", "127.0.0.1:9", "ssd"))
    for i in range(10):
        await leader.propose(_create(i))
    last = _journal(leader)[-1][1]
    await _until(lambda: _journal(target).durable_index >= last)
    journal = _journal(target)
    cuts: list[tuple[int, int]] = []  # (from, durable index then)
    real_delete = journal.deleteEntriesFrom

    def delete(entry_from: int) -> None:
        cuts.append((entry_from, journal.durable_index))
        real_delete(entry_from)

    journal.deleteEntriesFrom = delete  # type: ignore[method-assign,assignment]
    if small_batches:  # each append_entries carries about two entries
        leader._sync.conf.appendEntriesBatchSizeBytes = 1 + max(
            len(entry[0]) for entry in _journal(leader))
    lowered = threading.Event()

    def lower() -> None:  # on the leader's tick thread
        if not lowered.is_set():
            next_index = raftpatch.next_indexes(leader._sync)
            for node in list(next_index):
                if node.id == target.self_address:
                    next_index[node] = last - 6
            lowered.set()

    leader._sync.addOnTickCallback(lower)
    assert await asyncio.to_thread(lowered.wait, 5.0)
    leader._sync.removeOnTickCallback(lower)
    await leader.propose(_create(100))
    final = _journal(leader)[-1][1]
    await _until(lambda: _journal(target).durable_index >= final)
    assert cuts == []
    assert list(_journal(target)) == list(_journal(leader))


@pytest.mark.parametrize("pause", [0.0, 0.05], ids=["busy", "idle"])
async def test_a_leader_whose_sync_fails_stops_and_the_others_go_on(
        three: list[RaftNode], pause: float) -> None:
    leader = await _leader(three)
    await leader.propose(RegisterServer("rs1", "127.0.0.1:9", "ssd"))

    def failing(fd: int) -> None:
        raise OSError(5, "Input/output error")

    _journal(leader).fdatasync = failing
    await asyncio.sleep(pause)  # idle: appended at once, synced on the loop (no tick)
    with pytest.raises((Timeout, Unavailable)):  # never a success
        await leader.propose(_create(1))
    assert leader.failed and leader.leader() is None and not leader.caught_up()
    with pytest.raises(Unavailable):
        await leader.propose(_create(2))
    others = [n for n in three if n is not leader]
    started = time.monotonic()
    new = await _leader(others)
    assert new is not leader
    result = await new.propose(_create(3))
    assert isinstance(result, StreamMeta)
    assert time.monotonic() - started < 5
    assert leader.status().role == "follower"


async def test_acknowledged_commands_survive_a_power_loss_of_every_node(
        tmp_path: Path) -> None:
    addresses = [f"127.0.0.1:{free_port()}" for _ in range(3)]
    nodes = _start(addresses, tmp_path / "before")
    synced: dict[int, int] = {}  # node -> journal bytes its last sync covered

    def recording(i: int, journal: ChecksummedJournal) -> Callable[[int], None]:
        real = journal.fdatasync

        def sync(fd: int) -> None:
            size = journal.end
            real(fd)
            synced[i] = size
        return sync

    for i, node in enumerate(nodes):
        journal = _journal(node)
        synced[i] = journal.end
        journal.fdatasync = recording(i, journal)
    acknowledged: list[str] = []
    try:
        leader = await _leader(nodes)
        await leader.propose(RegisterServer("rs1", "127.0.0.1:9", "ssd"))

        async def one(i: int) -> None:
            try:
                await nodes[i % 3].propose(_create(i))
            except EstreamError:
                return
            acknowledged.append(f"s{i}")

        await asyncio.gather(*(one(i) for i in range(60)))
        # The power goes: every journal keeps what its syncs covered, nothing more.
        cut = {i: _journal(n).path.read_bytes()[: synced[i]] for i, n in enumerate(nodes)}
        metas = {i: _journal(n).meta_path.read_bytes() for i, n in enumerate(nodes)}
    finally:
        for node in nodes:
            await asyncio.to_thread(node.close)
    assert len(acknowledged) >= 40
    for i in range(3):
        shutil.copytree(tmp_path / "before" / f"n{i}", tmp_path / "after" / f"n{i}")
        (tmp_path / "after" / f"n{i}" / "raft.journal").write_bytes(cut[i])
        (tmp_path / "after" / f"n{i}" / "raft.journal.meta").write_bytes(metas[i])
    again = _start(addresses, tmp_path / "after")
    try:
        leader = await _leader(again)
        await leader.propose(_create(1000))  # commits everything before it in its term
        streams = leader.view().streams
        assert [name for name in acknowledged if name not in streams] == []
    finally:
        for node in again:
            await asyncio.to_thread(node.close)
