"""The nemesis's plan and bookkeeping: which faults each cycle injects, and how a writer
process's log becomes history.

A run is planned from its seed alone, before anything starts (so a seed replays the same
faults): the range-server count, then per cycle one or two :class:`Injection` s, how long
the faults are held under load, and how the writers are stopped afterwards (closed cleanly,
or killed with ``kill -9``). Faults are aimed at roles, not addresses ("the 2nd replica of
stream 0's open range", "range server 3"), resolved when injected.

Faults (:class:`Fault`): ``kill -9`` of a range server, ``SIGSTOP`` of one, a proxy
partition (its connections hang both ways, sockets open), a slow server (``slow``: its proxy
delays every frame both ways by 50 ms to 2 s, order kept: a replica that answers, late), a
wiped data dir (a new identity at the same address), a byte flipped inside an acknowledged
batch of a replica, a PD leader ``kill -9``, a whole-cluster ``kill -9`` and restart (under
load, or ``idle``: after the writers stopped, the case where only durable confirms can show
the last records), a stream deleted and created again under its writer (``recreate``: a
new incarnation of the name, whose history is checked on its own), and a range server's
disk filled to the last byte, then freed (``full-disk``: writers roll away, the server
recovers without a restart).
Beside the cycles, for the whole run: short writer sessions (open, 0-3 appends, close) on
their own stream, and a hostile client (:mod:`tests.chaos.hostile`).

:func:`one_server_down` says whether a cycle leaves exactly one range server out of service
at a time (the contract then promises that no append waits more than 5 s).

At most one recreate per cycle, and never a full disk with a whole-cluster crash (the
full disk must come back without a restart).

Safety of the plan: at most one fault that destroys a copy (wipe, flip) per cycle, so
with ``replicas=3, ack_count=2`` every acknowledged record keeps an intact copy; the
driver also injects one only while every replica PD lists is whole and sound (otherwise a
``kill -9`` of the same target instead), so copies destroyed in different cycles never add
up. At most one PD-wide fault per cycle, and it comes last.

Pure: no I/O.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import StrEnum

from tests.chaos.history import History


class Fault(StrEnum):
    KILL9 = "kill9"
    SIGSTOP = "sigstop"
    PARTITION = "partition"
    WIPE = "wipe"
    FLIP = "flip"
    PD_LEADER = "pd-leader"
    CRASH_ALL = "crash-all"
    RECREATE = "recreate"  # target: Target(stream, 0), the stream deleted and created again
    FULL_DISK = "full-disk"
    SLOW = "slow"  # every frame to and from the server delayed by Injection.delay_ms


DESTRUCTIVE = frozenset({Fault.WIPE, Fault.FLIP})
CLUSTER_WIDE = frozenset({Fault.PD_LEADER, Fault.CRASH_ALL})
WEIGHTS: dict[Fault, float] = {
    Fault.KILL9: 2.0, Fault.SIGSTOP: 2.0, Fault.PARTITION: 2.0, Fault.WIPE: 1.5,
    Fault.FLIP: 1.5, Fault.PD_LEADER: 1.0, Fault.CRASH_ALL: 1.0, Fault.RECREATE: 1.0,
    Fault.FULL_DISK: 1.5, Fault.SLOW: 1.5,
}
SERVER_FAULTS = frozenset({Fault.KILL9, Fault.SIGSTOP, Fault.PARTITION, Fault.WIPE, Fault.FLIP,
                           Fault.FULL_DISK, Fault.SLOW})
# a slow server's delay per frame and direction: a replica just behind, one far enough behind
# to be dropped by the chase bound or time out, and one in between
slow_delays_ms = (50, 400, 2000)
hot_target_share = 0.8  # faults aimed at a replica of an open range rather than any server
hold_s_min, hold_s_max = 2.0, 4.0


@dataclass(frozen=True, slots=True)
class Target:
    """A range server by role: replica ``replica`` of stream ``stream``'s open range, or
    (``stream`` None) the cluster's range server number ``replica``."""

    stream: int | None
    replica: int

    def __str__(self) -> str:
        if self.stream is None:
            return f"rs#{self.replica}"
        return f"s{self.stream}.open[{self.replica}]"


@dataclass(frozen=True, slots=True)
class Injection:
    fault: Fault
    target: Target | None = None  # server faults only
    idle: bool = False  # CRASH_ALL only: injected after the writers stopped
    delay_ms: int = 0  # SLOW only: each frame's delay, both ways

    def __str__(self) -> str:
        if self.fault is Fault.RECREATE and self.target is not None:
            return f"{self.fault}@s{self.target.stream}"
        if self.fault is Fault.SLOW and self.target is not None:
            return f"{self.fault}({self.delay_ms}ms)@{self.target}"
        if self.target is not None:
            return f"{self.fault}@{self.target}"
        return f"{self.fault}(idle)" if self.idle else str(self.fault)


@dataclass(frozen=True, slots=True)
class CyclePlan:
    injections: tuple[Injection, ...]
    hold_s: float  # the faults last this long under load before healing
    kill_writers: bool  # stop the writers with kill -9 (else SIGTERM: a clean close)

    def __str__(self) -> str:
        stop = "kill -9" if self.kill_writers else "close"
        return f"[{', '.join(map(str, self.injections))}] hold={self.hold_s:.1f}s writers:{stop}"


@dataclass(frozen=True, slots=True)
class RunPlan:
    seed: int
    range_servers: int
    cycles: tuple[CyclePlan, ...]


def plan_run(seed: int, cycles: int, streams: int, *,
             range_servers: int | None = None,
             faults: frozenset[Fault] = frozenset(Fault)) -> RunPlan:
    """The whole run from ``seed``: topology (3 or 4 range servers unless given) and cycles
    drawing from ``faults`` only (every kind unless given).

    >>> a, b = plan_run(7, 3, 2), plan_run(7, 3, 2)
    >>> a == b and len(a.cycles) == 3 and a.range_servers in (3, 4)
    True
    """
    rng = random.Random(seed)
    servers = rng.choice((3, 4))
    if range_servers is not None:
        servers = range_servers
    return RunPlan(seed, servers, tuple(plan_cycle(rng, servers, streams, faults)
                                        for _ in range(cycles)))


def plan_cycle(rng: random.Random, range_servers: int, streams: int,
               faults: frozenset[Fault] = frozenset(Fault)) -> CyclePlan:
    """One or two faults that never destroy two copies, with at most one cluster-wide and
    at most one recreate."""
    wanted = rng.choice((1, 2))
    chosen: list[Injection] = []
    while len(chosen) < wanted:
        fault = _weighted(rng)
        if fault not in faults:
            continue
        if fault in DESTRUCTIVE and any(i.fault in DESTRUCTIVE for i in chosen):
            continue
        if fault in CLUSTER_WIDE and any(i.fault in CLUSTER_WIDE for i in chosen):
            continue
        if fault is Fault.RECREATE and any(i.fault is Fault.RECREATE for i in chosen):
            continue
        if {fault, *(i.fault for i in chosen)} >= {Fault.FULL_DISK, Fault.CRASH_ALL}:
            continue  # a full disk must come back without a restart
        if fault is Fault.RECREATE:
            chosen.append(Injection(fault, Target(rng.randrange(streams), 0)))
        elif fault is Fault.CRASH_ALL:
            chosen.append(Injection(fault, idle=rng.random() < 0.5))
        elif fault is Fault.PD_LEADER:
            chosen.append(Injection(fault))
        elif fault is Fault.SLOW:
            chosen.append(Injection(fault, _target(rng, range_servers, streams),
                                    delay_ms=rng.choice(slow_delays_ms)))
        else:
            chosen.append(Injection(fault, _target(rng, range_servers, streams)))
    chosen.sort(key=_order)
    return CyclePlan(tuple(chosen), round(rng.uniform(hold_s_min, hold_s_max), 1),
                     kill_writers=rng.random() < 0.5)


def one_server_down(plan: CyclePlan) -> bool:
    """Whether the cycle's faults take exactly one range server out under load and nothing
    else: the rule "with exactly replica_count servers and one of them dead or hung, no
    append waits more than 5 s for a seal or roll" applies (a wipe or flip restarts its
    server at once: a short outage too).

    >>> from tests.chaos.nemesis import Target as T
    >>> one_server_down(CyclePlan((Injection(Fault.SIGSTOP, T(0, 1)),), 2.0, False))
    True
    >>> one_server_down(CyclePlan((Injection(Fault.KILL9, T(0, 1)),
    ...                            Injection(Fault.PD_LEADER)), 2.0, False))
    False
    >>> one_server_down(CyclePlan((Injection(Fault.RECREATE, T(0, 0)),), 2.0, False))
    False
    """
    return len(plan.injections) == 1 and plan.injections[0].fault in SERVER_FAULTS


def _weighted(rng: random.Random) -> Fault:
    faults = list(WEIGHTS)
    return rng.choices(faults, weights=[WEIGHTS[f] for f in faults])[0]


def _target(rng: random.Random, range_servers: int, streams: int) -> Target:
    if rng.random() < hot_target_share:
        return Target(rng.randrange(streams), rng.randrange(3))
    return Target(None, rng.randrange(range_servers))


def _order(injection: Injection) -> int:
    """Destroying faults first (they restart their server and wait for it), cluster-wide
    faults last (a crash restarts everything: nothing after it to undo)."""
    if injection.fault in DESTRUCTIVE:
        return 0
    return 2 if injection.fault in CLUSTER_WIDE else 1


# -- writer logs (tests/chaos/nemesis_writer.py) -------------------------------------------


@dataclass(slots=True)
class WriterLog:
    """What one writer process's log says, beside the appends folded into the history."""

    acknowledged: int = 0
    failed: int = 0
    unknown: int = 0
    opens: int = 0
    open_failures: list[str] = field(default_factory=list)
    hung: int = 0  # appends with no outcome within the delivery timeout + grace
    untyped: int = 0
    closed: bool = False  # CLOSED after SIGTERM
    close_failure: str = ""
    max_acked_offset: int = -1
    slowest_s: float = 0.0  # the longest an append took to end, either way
    slowest: str = ""  # that append's line
    empty_sessions: int = 0  # writers opened and closed cleanly with no append between
    rolls: int = 0  # new ranges the closed writers rolled to (a failed replica)
    stream_ids: set[int] = field(default_factory=set)  # the incarnations its writers opened


HistoryFor = Callable[[int], History]  # a stream id (0: not logged) -> its incarnation's


def fold_writer_log(histories: History | HistoryFor, writer: str,
                    lines: Iterable[str]) -> WriterLog:
    """Add one writer process's appends to the history of the incarnation (stream id) each
    writer session opened (``histories``: one history for all, or one per stream id); see
    nemesis_writer for the lines.

    >>> h = History()
    >>> log = fold_writer_log(h, "w", ["OPEN 3 12 7", "A w-0", "K w-0 0 5", "A w-1",
    ...                                 "T w-1 Timeout 10002", "A w-2"])
    >>> (log.acknowledged, log.unknown, [a.outcome.value for a in h.appends])
    (1, 2, ['ok', 'unknown', 'unknown'])
    >>> by_id = {7: History(), 9: History()}
    >>> log = fold_writer_log(by_id.__getitem__, "w", ["OPEN 1 3 7", "A w-0",
    ...     "F w-0 StreamNotFound 4", "OPEN 1 2 9", "A w-1", "K w-1 0 2", "CLOSED 1 1",
    ...     "OPEN 2 2 9", "CLOSED 1 0"])
    >>> [len(by_id[i].appends) for i in (7, 9)], log.empty_sessions, sorted(log.stream_ids)
    ([1, 1], 1, [7, 9])
    >>> log.rolls
    1
    """
    history_for: HistoryFor = ((lambda _: histories) if isinstance(histories, History)
                               else histories)
    log = WriterLog()
    history: History | None = None  # the open session's (set by OPEN)
    attempted: dict[str, History] = {}
    appended_in_session = True  # no session open yet
    for line in lines:
        kind, _, rest = line.partition(" ")
        parts = rest.split(" ")
        if kind == "A" and len(parts) == 1:
            attempted[parts[0]] = history or history_for(0)
            appended_in_session = True
            continue
        if kind in ("K", "F", "T", "U", "H"):  # in the history of the session it was made in
            where = attempted.get(parts[0]) or history or history_for(0)
        if kind == "K" and len(parts) == 3:
            offset = int(parts[1])
            where.ack(writer, parts[0].encode(), offset, elapsed_s=int(parts[2]) / 1000)
            log.acknowledged += 1
            log.max_acked_offset = max(log.max_acked_offset, offset)
        elif kind in ("F", "T", "U") and len(parts) == 3:
            where.fail(writer, parts[0].encode(), parts[1], unknown=kind != "F",
                       elapsed_s=int(parts[2]) / 1000, typed=kind != "U")
            log.failed += kind == "F"
            log.unknown += kind != "F"
            log.untyped += kind == "U"
        elif kind == "H" and len(parts) == 2:
            where.fail(writer, parts[0].encode(), "no outcome (hung)", unknown=True,
                       elapsed_s=int(parts[1]) / 1000)
            log.unknown += 1
            log.hung += 1
        elif kind == "OPEN":
            log.opens += 1
            stream_id = int(parts[2]) if len(parts) >= 3 and parts[2].isdigit() else 0
            history = history_for(stream_id)
            log.stream_ids.add(stream_id)
            appended_in_session = False
        elif kind == "OPENFAIL":
            log.open_failures.append(rest)
        elif kind == "CLOSED":
            log.closed = True
            log.empty_sessions += not appended_in_session
            log.rolls += int(parts[1]) if len(parts) >= 2 and parts[1].isdigit() else 0
            appended_in_session = True
        elif kind == "CLOSEFAIL":
            log.close_failure = rest
        else:
            continue
        if kind in ("K", "F", "T", "U", "H"):
            attempted.pop(parts[0], None)
            elapsed_s = int(parts[-1]) / 1000
            if elapsed_s > log.slowest_s:
                log.slowest_s, log.slowest = elapsed_s, line
    for value, where in attempted.items():  # killed mid-append: stored once or not at all
        where.fail(writer, value.encode(), "killed", unknown=True)
        log.unknown += 1
    return log
