"""One microbatch's state inside the engine: where it is, its path, and the compute spent on it.

``stage`` is the stage of the node holding it (0 at the origin, S+1 at the sink); ``path[k-1]`` is
the relay of stage k. Compute records keep, per stage, the (node, incarnation, seconds) of the hop
that currently counts; a recovery overwrites them, so what they hold at the end is the final path.
A forward a repair overwrote is kept as ``recomputed_s`` (the work done twice). In a client-routed
data plane (``client_routed``) every hop starts and ends at the origin.
"""

from __future__ import annotations

from collections.abc import Iterator

from gwtf.coordinator_free.protocol.config import DATA_STAGE
from gwtf.coordinator_free.sim.policy import Direction, MicrobatchView

ComputeRecord = tuple[str, int, float]


class Microbatch:
    """Mutable engine-side state of one microbatch (the policy sees ``view()``)."""

    __slots__ = (
        "_backward",
        "_forward",
        "_sink_record",
        "abandoned",
        "acked_seq",
        "attempt",
        "client_routed",
        "direction",
        "done",
        "hop_sent_s",
        "hop_seq",
        "iteration",
        "mb_id",
        "origin",
        "parked_at",
        "path",
        "progress_s",
        "recomputed_s",
        "sink",
        "stage",
        "stages",
        "version",
    )

    def __init__(
        self,
        mb_id: int,
        origin: str,
        iteration: int,
        stages: int,
        now: float,
        client_routed: bool = False,
    ) -> None:
        self.mb_id = mb_id
        self.client_routed = client_routed
        self.origin = origin
        self.iteration = iteration
        self.stages = stages
        self.attempt = 0
        self.version = 0
        self.hop_seq = 0
        self.acked_seq = 0
        self.done = False
        self.abandoned = False
        self.parked_at: str | None = None
        self.hop_sent_s = now
        self._reset(now)

    def _reset(self, now: float) -> None:
        self.stage = DATA_STAGE
        self.direction: Direction = "forward"
        self.path: list[str | None] = [None] * self.stages
        self.sink: str | None = None
        self.progress_s = now
        self._forward: dict[int, ComputeRecord] = {}
        self._backward: dict[int, ComputeRecord] = {}
        self._sink_record: ComputeRecord | None = None
        self.recomputed_s = 0.0

    def view(self) -> MicrobatchView:
        return MicrobatchView(
            mb_id=self.mb_id,
            origin=self.origin,
            iteration=self.iteration,
            attempt=self.attempt,
            stage=self.stage,
            direction=self.direction,
            path=tuple(self.path),
            sink=self.sink,
        )

    def set_next(self, receiver: str) -> None:
        """The forward is being sent to ``receiver`` (stage + 1, or the sink after stage S)."""
        if self.stage < self.stages:
            self.path[self.stage] = receiver
        else:
            self.sink = receiver

    def previous_hop(self) -> str:
        """Where the backward goes from the current holder."""
        if self.stage >= 2 and not self.client_routed:
            hop = self.path[self.stage - 2]
            assert hop is not None, "a backward only retraces a recorded path"
            return hop
        return self.origin

    def upstream_of_dead_hop(self) -> str:
        """The node buffering the input of the dead hop (the stage below the holder)."""
        dead_stage = self.stage - 1
        if dead_stage >= 2 and not self.client_routed:
            hop = self.path[dead_stage - 2]
            assert hop is not None, "a repaired hop has a recorded upstream"
            return hop
        return self.origin

    def rewind_before(self, receiver: str) -> list[str]:
        """The forward to ``receiver`` is to be sent again: go back to the stage before it and
        return the relays beyond it that the microbatch reached meanwhile (a late ack lets the
        receiver compute the forward, and send it on, before the sender's deadline)."""
        if receiver == self.sink:
            stage = self.stages + 1
        elif receiver in self.path:
            stage = self.path.index(receiver) + 1
        else:
            return []
        beyond = [node for node in self.path[stage:] if node is not None]
        self.stage = stage - 1
        self.direction = "forward"
        return beyond

    def replace_dead_hop(self, replacement: str) -> None:
        self.path[self.stage - 2] = replacement

    def relays(self) -> Iterator[str]:
        return (node for node in self.path if node is not None)

    def record_forward(self, node_id: str, incarnation: int, seconds: float) -> None:
        self.stage += 1
        self._forward[self.stage] = (node_id, incarnation, seconds)

    def record_sink(self, node_id: str, incarnation: int, seconds: float) -> None:
        self.stage = self.stages + 1
        self.direction = "backward"
        self._sink_record = (node_id, incarnation, seconds)

    def record_backward(self, node_id: str, incarnation: int, seconds: float) -> None:
        self.stage -= 1
        self._backward[self.stage] = (node_id, incarnation, seconds)

    def record_repair(
        self, node_id: str, incarnation: int, seconds: float, forward_share: float
    ) -> None:
        """A replacement recomputed forward + backward of the stage below the holder."""
        self.stage -= 1
        superseded = self._forward.get(self.stage)
        if superseded is not None:
            self.recomputed_s += superseded[2]
        self._forward[self.stage] = (node_id, incarnation, seconds * forward_share)
        self._backward[self.stage] = (node_id, incarnation, seconds * (1.0 - forward_share))

    def records(self) -> Iterator[ComputeRecord]:
        """Compute of the final path: one forward and one backward per stage, and the sink."""
        yield from self._forward.values()
        yield from self._backward.values()
        if self._sink_record is not None:
            yield self._sink_record

    def unpark(self, now: float) -> None:
        """It leaves the node it was parked at (sent on, or lost with that node). Time parked at
        a live node is progress for the watchdog (``_on_stall_check``), so it counts from now:
        otherwise a hop sent after a long wait would be cut before its own deadline."""
        if self.parked_at is not None:
            self.parked_at = None
            self.progress_s = now

    def restart(self, now: float) -> None:
        self.version += 1
        self.attempt += 1
        self.parked_at = None
        self._reset(now)
