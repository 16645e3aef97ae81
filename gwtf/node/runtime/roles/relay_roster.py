"""The relays a data node believes alive, by stage, and the end of an iteration among them.

The flow protocol knows only a data node's neighbours (stage 1 and the last stage); discovery
knows the rest, and may still list a relay that died. So a relay counts as alive when the flow
protocol knows it alive, or discovery lists it and it has not failed a liveness probe since it
was last heard from. Ending an iteration probes them all: those that answer are each stage's
replica set, announced to every one of them, so every replica of a stage averages over the same
list and none waits for a dead one. A replica that holds gradients and dies after the probe (or
before it) leaves its stage's round incomplete: that stage does not step, and the data node redoes
what it held and ends the stage again.

A failed probe must not be final: a middle stage's relay that comes back (restarted under its
identity, or only slow for a moment) is never seen alive by the flow protocol, and a relay left
out of every end takes hops whose gradients never reach the average and falls behind its
replicas for good. So any sign of life clears it (``heard``): a control request it makes (a
relay tells the data nodes it is up before it takes hops, ``report_alive``), or discovery
hearing from it (its hint, its own card, a peer exchange). A relay that answers a data node
(``gradient_redo.py`` asks every relay of a microbatch's path) is known from then on, at the
stage it names, before discovery may list it.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

import trio
from libp2p.peer.id import ID

from gwtf.errors import ProtocolError
from gwtf.node.p2p.rpc import PeerUnavailable, RequestResponse
from gwtf.node.runtime.dataplane import control
from gwtf.node.runtime.dataplane.exchange import DataPlane
from gwtf.node.runtime.flow.service import FlowService

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EndOutcome:
    """How an iteration's end went, by stage: how many replicas stepped, the stages that did
    not step because their round missed a holder of gradients, and the holders that did not
    answer (dead, or gone quiet: what they held is lost unless redone)."""

    stepped: dict[int, int]
    unstepped: frozenset[int]
    missing: dict[int, list[str]]
    #: Holders the last attempt left out (named missing by a replica that stepped, or not
    #: probed alive, so in no round): their gradients are in no step, lost.
    left_out: frozenset[str] = frozenset()


class DiscoveredRelays(Protocol):
    """Relay -> stage of every relay discovery knows now, alive or not. Does not block or
    raise."""

    def __call__(self) -> dict[str, int]: ...


@dataclass
class RelayRoster:
    plane: DataPlane
    flow: FlowService
    #: The liveness probe's deadline; None: the larger of the keep-alive timeout and twice the
    #: hop ack deadline (a loaded relay answers late, not never).
    probe_timeout_s: float | None = None
    #: Relay -> stage of every relay discovery knows (set by the node).
    discovered: DiscoveredRelays = dict
    #: Relays discovery lists that failed a liveness probe and were not heard from since.
    unreachable: set[str] = field(default_factory=set)
    #: Relays heard from after they failed a probe: what is open to them may belong to the
    #: process that failed (a restart), so the next probe dials them anew.
    returned: set[str] = field(default_factory=set)
    #: Relay -> stage of relays that said so themselves (``learn``): a joiner of a middle stage
    #: computes hops before discovery may list it, and its gradients must reach the average.
    told: dict[str, int] = field(default_factory=dict)

    def learn(self, relay: str, stage: int) -> None:
        """``relay`` answered, serving ``stage``: every iteration's end asks it from now on."""
        self.told[relay] = stage
        self.heard(relay)

    def heard(self, peer_id: str) -> None:
        """``peer_id`` showed a sign of life: the next iteration's end probes it again."""
        if peer_id in self.unreachable:
            self.unreachable.discard(peer_id)
            self.returned.add(peer_id)

    def gone(self, relay: str) -> None:
        """``relay`` failed a liveness check: no iteration's end waits for it until it is heard
        from again."""
        self.unreachable.add(relay)
        self.flow.dispatch(self.flow.node.peer_dead(relay, trio.current_time()))

    def believed(self) -> dict[str, int]:
        """Relay -> stage, for every relay that may be alive: those the flow protocol knows alive
        (only stage 1 and the last stage: its neighbours), and those discovery found that it
        does not know (a middle stage's, or one not yet introduced), unless one failed a probe."""
        stage_of = {
            relay: stage
            for relay, stage in (self.discovered() | self.told).items()
            if 1 <= stage <= self.plane.stages and relay not in self.unreachable
        }
        for peer in self.flow.node.peers.values():
            if peer.stage >= 1:
                if peer.alive:
                    stage_of[peer.peer_id] = peer.stage
                    self.unreachable.discard(peer.peer_id)
                else:
                    stage_of.pop(peer.peer_id, None)
        return stage_of

    async def reachable(self) -> dict[str, int]:
        """``believed``, once what is open to a returned relay is dropped: py-libp2p may still
        hold a connection to its old process, where requests go unanswered until their
        deadline."""
        stage_of = self.believed()
        for relay in sorted(self.returned & set(stage_of)):
            await self.plane.rpc.drop_peer(ID.from_base58(relay))
            self.returned.discard(relay)
        return stage_of

    def replicas_of(self, stage: int) -> list[str]:
        """The relays of ``stage`` that may be alive (1..S; the sink stage S+1 has none)."""
        return sorted(relay for relay, at in self.believed().items() if at == stage)

    def probe_deadline_s(self) -> float:
        if self.probe_timeout_s is not None:
            return self.probe_timeout_s
        return max(self.flow.node.config.keepalive_timeout_s, 2 * self.plane.ack_deadline_s)

    async def end_iteration(
        self,
        iteration: int,
        reply_timeout_s: float,
        holders: Mapping[str, int] | None = None,
        attempt: int = 0,
        stages: Collection[int] | None = None,
    ) -> EndOutcome:
        """Ask every live relay (of ``stages``, or all) to average with its stage's live
        replicas and step (each within ``reply_timeout_s``). ``holders`` (relay -> stage) hold
        gradients of the iteration: a stage whose round misses one does not step, unless this
        is the last attempt (``control.EndIteration``)."""
        holders = holders or {}
        final = control.is_last_attempt(attempt)
        # The holders answered this iteration's ``Holds``: probed even where a failed hop
        # made the flow core count one dead (a stream cut under a live peer), or its
        # gradients would be left out of every round, and unseen.
        stage_of = {
            relay: stage
            for relay, stage in ((await self.reachable()) | dict(holders)).items()
            if stages is None or stage in stages
        }
        alive = await self.probe(sorted(stage_of))
        self.unreachable.update(set(stage_of) - set(alive))
        by_stage: dict[int, list[str]] = {}
        for relay in alive:
            by_stage.setdefault(stage_of[relay], []).append(relay)
        missing: dict[int, set[str]] = {}
        for holder, stage in holders.items():
            if holder not in alive and (stages is None or stage in stages):
                missing.setdefault(stage, set()).add(holder)  # died after it said what it holds
        unstepped = set(missing)
        stepped: dict[int, int] = {}
        left_out: set[str] = set()
        asking = {relay: trio.CancelScope() for relay in alive}
        grace_s = self.probe_deadline_s()

        async def ask(relay: str) -> None:
            stage = stage_of[relay]
            held_here = tuple(sorted(h for h, s in holders.items() if s == stage and h in alive))
            request = control.EndIteration(iteration, tuple(by_stage[stage]), held_here, attempt)
            reply = None
            with asking[relay]:
                try:
                    reply = control.decode_reply(
                        await control.ask(self.plane.rpc, relay, request, reply_timeout_s)
                    )
                except (PeerUnavailable, ProtocolError) as exc:
                    log.warning("relay %s did not end iteration %s: %s", relay, iteration, exc)
            if reply is None:
                if relay in holders:
                    missing.setdefault(stage, set()).add(relay)
                return
            said = reply.get("missing")
            named = [h for h in said if holders.get(h) == stage] if isinstance(said, list) else []
            if reply["ok"]:
                stepped[stage] = stepped.get(stage, 0) + 1
                left_out.update(named)
            elif reply.get("why") == "incomplete":
                unstepped.add(stage)
                for holder in named:
                    if holder in asking:
                        # Its round went on without it: it died while averaging, or is slow.
                        # Its own answer decides, but it is not waited for as long.
                        deadline = trio.current_time() + grace_s
                        asking[holder].deadline = min(asking[holder].deadline, deadline)

        async with trio.open_nursery() as nursery:
            for relay in alive:
                if final or stage_of[relay] not in missing:
                    nursery.start_soon(ask, relay)
        if final:
            # A holder that failed the probe is in no round (no replica is told of it, so none
            # names it missing): its stage steps without it, whatever answered.
            left_out.update(h for gone in missing.values() for h in gone if h not in alive)
        # One replica that stepped means its round was complete: a reply saying otherwise is
        # another replica's (wrong) word.
        return EndOutcome(
            stepped,
            frozenset(unstepped - set(stepped)),
            {stage: sorted(m) for stage, m in missing.items()},
            frozenset(left_out),
        )

    async def probe(self, relays: list[str]) -> list[str]:
        """The relays among ``relays`` that answer a liveness probe (asked twice before a relay
        counts as gone: one missed answer on a loaded machine must not cost a stage its step)."""
        answered: list[str] = []
        timeout_s = self.probe_deadline_s()

        async def probe(relay: str) -> None:
            for attempt in range(2):
                try:
                    await control.ask(self.plane.rpc, relay, control.Alive(), timeout_s)
                except PeerUnavailable as exc:
                    log.info("relay %s missed liveness probe %s: %s", relay, attempt + 1, exc)
                    continue
                answered.append(relay)
                return
            self.gone(relay)

        async with trio.open_nursery() as nursery:
            for relay in relays:
                nursery.start_soon(probe, relay)
        return sorted(answered)


async def report_alive(rpc: RequestResponse, data_nodes: Iterable[str], timeout_s: float) -> int:
    """Tell the run's data nodes that this relay is up, before it takes hops: one that found it
    gone at an iteration's end then asks it to end iterations again, so the hops it computes
    reach its stage's average. Best effort (a data node it cannot reach now hears of it through
    discovery); returns how many answered."""
    answered = 0

    async def tell(peer: str) -> None:
        nonlocal answered
        try:
            await control.ask(rpc, peer, control.Alive(), timeout_s)
        except PeerUnavailable as exc:
            log.info("data node %s did not hear that this relay is up: %s", peer, exc)
            return
        answered += 1

    async with trio.open_nursery() as nursery:
        for peer in sorted(set(data_nodes)):
            nursery.start_soon(tell, peer)
    return answered
