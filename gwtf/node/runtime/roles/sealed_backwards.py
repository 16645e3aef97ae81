"""The microbatches whose ``Holds`` their origin was answered at a relay (``RelayRole.holds``).

A data node asks ``Holds`` once every microbatch of its share is done, so a backward of one of
them that reaches the relay later is a copy (a repair around a hop whose ack was lost) and is
declined: taken, it would count twice in the stage's sum, unseen by the answer. A seal is
lifted by the origin's ``Forget`` (it trains the iteration again) and dropped with the
iteration's kept state.

Each origin holds one span per iteration, the smallest range covering every range it asked
about: a data node's share is one contiguous range of ids (``shard_microbatches``), asked in
chunks of ``control.MAX_HOLDS``, and a span only ever covers its own origin's microbatches,
so a peer asking about made-up ranges seals nothing of anyone else's and fills no room another
origin needs. Only the iteration this relay is at, or the next, is sealed: an old one's state
is dropped at the next hop anyway, and one far ahead would be kept for good.
"""

from __future__ import annotations

from dataclasses import dataclass, field

#: Origins sealed per iteration: data nodes of one run, each one span.
MAX_ORIGINS = 1024


@dataclass
class SealedBackwards:
    #: Iteration -> origin -> (first, end) of the microbatches it was answered ``Holds`` for.
    spans: dict[int, dict[str, tuple[int, int]]] = field(default_factory=dict)

    def seal(self, iteration: int, origin: str, first: int, end: int, step: int) -> bool:
        """Seal ``first .. end - 1`` of ``origin`` at ``iteration`` (this relay is at
        ``step``); False when not kept (another iteration, or too many origins)."""
        if not step <= iteration <= step + 1:
            return False
        if self.full(iteration, origin):
            return False
        sealed = self.spans.setdefault(iteration, {})
        low, high = sealed.get(origin, (first, end))
        sealed[origin] = (min(low, first), max(high, end))
        return True

    def full(self, iteration: int, origin: str) -> bool:
        """Whether ``origin`` finds no room at ``iteration``: ``MAX_ORIGINS`` others hold it."""
        sealed = self.spans.get(iteration, {})
        return origin not in sealed and len(sealed) >= MAX_ORIGINS

    def covers(self, iteration: int, origin: str, microbatch: int) -> bool:
        span = self.spans.get(iteration, {}).get(origin)
        return span is not None and span[0] <= microbatch < span[1]

    def lift(self, iteration: int, origin: str) -> None:
        """``origin`` trains ``iteration`` again: its microbatches are not done."""
        sealed = self.spans.get(iteration)
        if sealed is not None:
            sealed.pop(origin, None)
            if not sealed:
                del self.spans[iteration]

    def drop_before(self, before: int) -> None:
        for iteration in [i for i in self.spans if i < before]:
            del self.spans[iteration]
