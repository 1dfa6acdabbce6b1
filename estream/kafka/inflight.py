"""What one Kafka connection's requests hold while they are served: when to read on.

A connection reads its next request only while it has room: fewer than
:data:`requests_in_flight_max` requests unanswered (:data:`others_in_flight_max` besides
Produce: a Fetch's long poll and answer are as large as the client asks), holding less
than :data:`request_bytes_in_flight_max` (each request its frame's bytes from when it is
read, then its answer's from when that is ready, until written). A connection with
nothing in flight always has room (a frame is bounded by ``frame_bytes_max``). Many small
Produce requests (librdkafka's: one partition each) are served at once; large ones are
bounded by their bytes. Pure: the gateway waits for room.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from estream.wire import limits

requests_in_flight_max: Final = 1024  # per connection; reading pauses at it
others_in_flight_max: Final = 64  # of them, requests other than Produce
request_bytes_in_flight_max: Final = limits.connection_inflight_bytes_max  # per connection:
#   frames being served and answers waiting to be written; reading pauses at it


@dataclass(slots=True)
class InFlight:
    """One connection's requests read and not yet answered, and the bytes they hold."""

    requests: int = 0
    others: int = 0  # of them, not Produce
    held_bytes: int = 0

    def room(self, produce: bool) -> bool:
        """Whether the next request (a Produce or not) may be started."""
        return self.requests == 0 or (
            self.requests < requests_in_flight_max
            and self.held_bytes < request_bytes_in_flight_max
            and (produce or self.others < others_in_flight_max))

    def started(self, frame_bytes: int, produce: bool) -> None:
        """A request of ``frame_bytes`` is read and being served."""
        self.requests += 1
        self.others += not produce
        self.held_bytes += frame_bytes

    def answered(self, frame_bytes: int, answer_bytes: int) -> None:
        """Its answer is ready (``answer_bytes``, 0 for none): it holds that, not its frame."""
        self.held_bytes += answer_bytes - frame_bytes

    def written(self, answer_bytes: int, produce: bool) -> None:
        """Its answer is written (or dropped): it holds nothing."""
        self.requests -= 1
        self.others -= not produce
        self.held_bytes -= answer_bytes


__all__ = ["InFlight", "others_in_flight_max", "request_bytes_in_flight_max",
           "requests_in_flight_max"]
