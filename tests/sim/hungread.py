"""A plain read whose first choice hangs (issue 27 item 3): the ``hung-holder-read`` rows.

Once the writer has records acknowledged, the server a plain read from 0 asks first hangs
(SIGSTOP) until the heal, and the real reader reads ``[0, acknowledged)`` at once: of the
unstriped stream (range 0's first replica, ``preferred``), or of the striped one (position 0
of its range 0, first in a read by offset). It must move to the next holder after its READ
bound (``CursorConfig.read_answer_ms_max``), not the client's 5 s request timeout (nor the
hang, which lasts until the heal), and deliver every record once, in order (the world's
delivery checks). A row of ``test_double_faults`` once passed only because its schedule
happened to order a healthy replica first.

Pure: no I/O (tests only).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from tests.sim.reading import CURSOR_CONFIG, Reading
from tests.sim.striped import STRIPED_STREAM

if TYPE_CHECKING:
    from tests.sim.test_sim import Sim

HUNG_READ_MARGIN_MS: Final = 500  # the read ends within its READ bound plus this
ACKED_BEFORE_HANG: Final = 10  # records acknowledged before the first choice hangs


def hung_holder_read(sim: Sim, stream: str, heal_at_ms: int) -> None:
    """The row's script (see the module; ``stream``: the unstriped one): the facts it
    leaves are checked by :func:`check_hung_holder_read`."""
    sim.faults.drop = 0.0
    sim.net.faults.reset_rate = 0.0
    striped = sim.striped

    def acked() -> int:
        return striped.writer.acked_end if striped is not None else sim.writers[-1].acked_end

    def strike() -> None:
        meta = striped.describe() if striped is not None else sim.describe()
        node = meta.ranges[0].replicas[0].id  # (server ids are the nodes: no wipe here)
        end = acked()
        sim.hang(node, heal_at_ms)  # resumed by the heal
        server = sim.servers[node]

        def ended(reader: Reading) -> None:
            sim.facts["hung read"] = (reader.done, reader.next_offset, end,
                                      sim.world.now_ms - reader.started_ms, server.hung)

        if striped is not None:
            on_deliver = striped.check_delivery
        else:
            on_deliver = sim.check_delivery
        Reading(sim.world, sim.net, "rh", STRIPED_STREAM if striped is not None else stream,
                start=0, end=end, preferred=None if striped is not None else node,
                on_deliver=on_deliver, on_end=ended)

    def ready() -> bool:
        return acked() >= ACKED_BEFORE_HANG

    def poll() -> None:
        if ready():
            strike()
        elif sim.world.now_ms < heal_at_ms:
            sim.world.after(1, poll)

    sim.world.after(1, poll)


def check_hung_holder_read(sim: Sim, trace: str) -> None:
    """The read ended whole while its first choice still hung, within the bound."""
    got = sim.facts.get("hung read")
    assert isinstance(got, tuple), f"the read did not end (or never started){trace}"
    done, next_offset, end, took_ms, still_hung = got
    assert done and next_offset == end, f"the read ended at {next_offset} of {end}{trace}"
    assert still_hung, f"the first choice resumed before the read ended{trace}"
    bound = CURSOR_CONFIG.read_answer_ms_max + HUNG_READ_MARGIN_MS
    assert took_ms <= bound, f"the read took {took_ms} ms past a hung holder{trace}"
