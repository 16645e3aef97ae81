"""The data nodes of a run agreeing on the end of each iteration.

A run's batch can be shared by several data nodes, each with a replica of the embedding and head
and its own shard of the microbatches. The relays must average and step only after every data
node's share is done, and only once. So a data node done with its share tells the others
(``BatchDone``) and waits until every other one has said so too, or has stopped answering
liveness probes (it is left out for the rest of the run). Of the data nodes whose share is done,
the one with the smallest id ends the iteration at the relays and tells the others
(``IterationEnded``); they start the next iteration only then, since a relay takes an early hop of
the next iteration as a sign that it is behind. If that data node dies before it says so, the
next in line ends the iteration (a relay answers a repeated request for an iteration it already
ended with the same reply). Before the first iteration the data nodes compare their shards: two
starting the same microbatches would collide at every relay, so that is refused at the start.

A data node that restarts, or a new one taking over a shard, asks to be taken (back) in
(``Rejoin``); so does one left out while alive (say, on an overloaded machine that missed the
probes): a microbatch of its that fails, or a wait for the others that drags on, makes it ask
whether the others still count it (``Shard``'s answer says), and if not it raises ``LeftOut``.
Membership changes only between iterations and only by the data node ending one: it names the
data nodes of the next iteration in its ``IterationEnded`` (to them all, the new one included),
so every data node waits for, and averages with, the same ones. The new one then loads the
embedding and head from another data node and starts at that next iteration. One that asked but
did not answer its ``Shard`` (a restarted one's new address may not be dialled yet) is asked
again at the next iteration ends, up to ``ADMIT_TRIES`` times.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Protocol

import trio
from libp2p.peer.id import ID

from gwtf.errors import ProtocolError, TrainingError
from gwtf.node.p2p.rpc import Decline, PeerUnavailable, RequestResponse
from gwtf.node.runtime.dataplane import control

log = logging.getLogger(__name__)

#: Missed liveness probes in a row after which a data node counts as gone.
PROBES_BEFORE_GONE = 2
#: Iteration ends at which a data node that asked to join is asked for its shard before it must
#: ask again: it just spoke, so a first silence is likely the dial (its new address not yet
#: tried), and its own next ask may come only after the run has ended.
ADMIT_TRIES = 3


def shard_microbatches(iteration: int, shard: int, shards: int, batch: int) -> range:
    """The ids of the microbatches the data node of ``shard`` (of ``shards``) starts in
    ``iteration``, ``batch`` of them: ``(iteration * shards + shard) * batch + j``. Distinct
    shards and iterations never share an id, so a microbatch id names one data node's
    microbatch in a run (relays key what they hold by it: ``held_forward.py``)."""
    first = (iteration * shards + shard) * batch
    return range(first, first + batch)


class LeftOut(Exception):
    """The other data nodes went on without this one: it must ask to be taken back in."""

    def __init__(self, iteration: int) -> None:
        super().__init__(f"left out of iteration {iteration} by the other data nodes")
        self.iteration = iteration


class DataNodeCandidates(Protocol):
    """The peers discovery says are data nodes of the run (stage 0), unchecked: candidates
    until they answer ``shard``. Does not block or raise."""

    def __call__(self) -> set[str]: ...


@dataclass
class DataPeers:
    rpc: RequestResponse
    node_id: str
    expected: int  # data nodes of the run, this one included
    shard: int  # this data node's shard, 0 .. expected - 1
    #: Peers discovery says are data nodes (stage 0): candidates until they answer ``shard``.
    known: DataNodeCandidates
    probe_timeout_s: float
    #: How long to wait on a data node that is still working before probing it again.
    patience_s: float
    #: The other data nodes: each answered ``shard`` with a shard of its own. Only these are
    #: waited for, so a peer that merely claims stage 0 cannot hold up an iteration.
    members: dict[str, int] = field(default_factory=dict)  # peer -> its shard
    gone: set[str] = field(default_factory=set)
    iteration: int = 0  # the iteration this data node is in
    done: dict[int, set[str]] = field(default_factory=dict)  # iteration -> whose share is done
    #: iteration -> data node -> the relays holding its share's gradients (``BatchDone``).
    holders: dict[int, dict[str, tuple[str, ...]]] = field(default_factory=dict)
    ended: dict[int, int] = field(default_factory=dict)  # iteration -> relays that stepped
    #: iteration -> the data nodes of the next one, as its end announced them.
    next_members: dict[int, tuple[str, ...]] = field(default_factory=dict)
    pending: set[str] = field(default_factory=set)  # data nodes that asked to be taken in
    restarted: set[str] = field(default_factory=set)  # pending members that asked back in
    joining: bool = False  # this data node asked to be taken (back) in and waits for it
    #: The iteration whose end, as another data node announced it, left this one out.
    left_out_at: int | None = None
    #: Where this data node tells a member it left out that it did, without waiting on it.
    background: trio.Nursery | None = None
    told_out: set[str] = field(default_factory=set)  # members told they were left out
    admit_tries: dict[str, int] = field(default_factory=dict)  # asker -> unanswered shard asks
    #: iteration -> data nodes that did not answer a check-in about it (not asked again).
    silent: dict[int, set[str]] = field(default_factory=dict)
    start_at: int | None = None  # the iteration the run took this data node in from
    _changed: trio.Event = field(default_factory=trio.Event)

    def others(self) -> list[str]:
        """The other data nodes not (yet) counted as gone."""
        return sorted(set(self.members) - self.gone)

    async def wait_for_all(self, timeout_s: float) -> None:
        """Wait until every other data node of the run has answered with a shard of its own
        (a ``TrainingError`` saying what to fix when two start the same one, or count the data
        nodes differently, or not all are found in time)."""
        if self.start_at is not None:
            return  # taken in mid-run: the data node that ended the last iteration named them
        with trio.move_on_after(timeout_s):
            while len(self.members) < self.expected - 1:
                candidates = self.known() - set(self.members) - {self.node_id}
                problems: list[str] = []
                async with trio.open_nursery() as nursery:
                    for peer in sorted(candidates):
                        nursery.start_soon(self._ask_shard, peer, problems)
                if problems:
                    raise TrainingError(problems[0])
                if len(self.members) < self.expected - 1:
                    await trio.sleep(0.1)
            return
        raise TrainingError(
            f"found {len(self.members) + 1} of the run's {self.expected} data nodes within "
            f"{timeout_s:g} s; start them all with a common bootstrap peer, or set "
            "training.data_nodes to how many there are"
        )

    async def _ask_shard(self, peer: str, problems: list[str]) -> None:
        answer = await self._shard_of(peer)
        if answer is None:
            return  # not up yet, or not a data node after all: asked again on the next round
        owners = {self.shard: self.node_id} | {s: p for p, s in self.members.items()}
        problem = self._shard_problem(peer, *answer, owners)
        if problem is not None:
            problems.append(problem)
            return
        assert isinstance(answer[0], int)  # as _shard_problem checked
        self.members[peer] = answer[0]

    async def _shard_of(self, peer: str) -> tuple[object, object] | None:
        """``peer``'s answer to ``shard``: (its shard, its count of data nodes); None if none."""
        try:
            reply = control.decode_reply(
                await control.ask(self.rpc, peer, control.Shard(), self.probe_timeout_s)
            )
        except (PeerUnavailable, ProtocolError) as exc:
            log.debug("no shard from %s: %s", peer, exc)
            return None
        return reply.get("shard"), reply.get("shards")

    def _shard_problem(
        self, peer: str, shard: object, shards: object, owners: dict[int, str]
    ) -> str | None:
        """What is wrong with ``peer`` starting ``shard`` of ``shards`` (None: nothing), given
        who starts which shard already."""
        if shards != self.expected:
            return (
                f"data node {peer} counts {shards} data nodes, this one {self.expected}: "
                "give every data node the same training.data_nodes"
            )
        if not isinstance(shard, int) or not 0 <= shard < self.expected:
            return f"data node {peer} answered shard {shard!r}, not 0..{self.expected - 1}"
        if shard in owners:
            return (
                f"data nodes {owners[shard]} and {peer} both start shard {shard}: give each "
                "data node its own training.data_shard"
            )
        return None

    def handle(
        self,
        peer: str,
        message: control.Shard | control.BatchDone | control.IterationEnded | control.Rejoin,
    ) -> bytes:
        if peer not in self.known():
            # Discovery may not have told this node yet: not an offence.
            raise Decline(f"{peer} is not known here as a data node of this run")
        if isinstance(message, control.Shard):
            return control.encode_reply(
                True, shard=self.shard, shards=self.expected, left_out=peer in self.gone
            )
        if isinstance(message, control.Rejoin):
            self._take_back(peer)
            return control.encode_reply(True)
        if isinstance(message, control.IterationEnded) and self.joining:
            if self.node_id in message.members:
                self.start_at = message.iteration + 1
                self._adopt(message.members)
                self._changed.set()
            return control.encode_reply(True)
        if (
            isinstance(message, control.IterationEnded)
            and peer in self.members
            and self.node_id not in message.members
        ):
            # Left out of that iteration, unless the word is older than the one this data
            # node was taken back in at (this one may have gone on alone for one iteration).
            if message.iteration + 1 >= self.iteration:
                self.left_out_at = message.iteration
                self._changed.set()
            return control.encode_reply(True)
        # A data node is at most one iteration ahead of another (an iteration ends only when
        # every shard is done): anything further is refused, so a peer cannot grow these maps.
        if message.iteration > self.iteration + 1:
            raise ProtocolError(
                f"{peer} speaks of iteration {message.iteration}; this data node is at "
                f"{self.iteration}"
            )
        if message.iteration < self.iteration:
            return control.encode_reply(True)  # a late word about an iteration that is over
        if isinstance(message, control.BatchDone):
            self.done.setdefault(message.iteration, set()).add(peer)
            self.holders.setdefault(message.iteration, {})[peer] = message.holders
        else:
            self.ended[message.iteration] = message.relays_stepped
            self.next_members[message.iteration] = message.members
        self._changed.set()
        return control.encode_reply(True)

    def _take_back(self, peer: str) -> None:
        if peer in self.members and peer not in self.gone:
            # It restarted: its share of the iteration at hand went with its old process.
            self.gone.add(peer)
            self.restarted.add(peer)
            log.warning("data node %s restarted; its share of this iteration is lost", peer)
        self.pending.add(peer)
        self._changed.set()  # a wait for its share ends

    def _adopt(self, members: tuple[str, ...]) -> None:
        """Take ``members`` as the data nodes of the next iteration."""
        listed = set(members) - {self.node_id}
        for peer in listed:
            self.members.setdefault(peer, -1)  # its shard: checked by the one that took it in
            self.gone.discard(peer)
            self.pending.discard(peer)
            self.told_out.discard(peer)
        self.gone |= set(self.members) - listed

    async def rejoin(self, timeout_s: float) -> int:
        """Ask the run's data nodes to take this one (back) in; return the iteration it trains
        from: the one after the next iteration to end."""
        self.joining = True
        self.left_out_at = None
        with trio.move_on_after(timeout_s):
            while self.start_at is None:
                async with trio.open_nursery() as nursery:
                    for peer in sorted(self.known() - {self.node_id}):
                        nursery.start_soon(self._tell, peer, control.Rejoin())
                await self._wait_for_change(self.patience_s)
        self.joining = False
        if self.start_at is None:
            raise TrainingError(
                f"no data node of the run took this one in within {timeout_s:g} s; check "
                "p2p.bootstrap_peers, and that the run is still training"
            )
        self.iteration = self.start_at
        return self.start_at

    async def agree_done(self, iteration: int, holders: tuple[str, ...] = ()) -> list[str]:
        """Say that this data node's share of ``iteration`` is done (and which relays hold its
        gradients); return the data nodes whose share is done (sorted, this one included) once
        every other one has said so or is gone, or the iteration was ended meanwhile."""
        async with trio.open_nursery() as nursery:
            for peer in self.others():
                nursery.start_soon(self._tell, peer, control.BatchDone(iteration, holders))
        while iteration not in self.ended:
            waiting = [p for p in self.others() if p not in self.done.get(iteration, ())]
            if not waiting:
                break
            if self.left_out_at is not None:
                raise LeftOut(self.left_out_at)
            if not await self._wait_for_change(self.patience_s):
                await self._probe_all(waiting)
                await self.check_in(iteration)
        for kept in (self.done, self.holders):
            for old in [i for i in kept if i < iteration]:
                del kept[old]
        return sorted(({self.node_id} | self.done.get(iteration, set())) - self.gone)

    async def ended_by_other(self, iteration: int, live: list[str]) -> int | None:
        """Wait until the data node in charge of ending ``iteration`` (the first of ``live``
        still answering) says it did, and return how many relays stepped; None when this data
        node is in charge."""
        while True:
            leader = next(p for p in live if p not in self.gone)  # this node is never gone
            if leader == self.node_id:
                return None
            if self.left_out_at is not None:
                raise LeftOut(self.left_out_at)
            if iteration in self.ended or await self._wait_for_change(self.patience_s):
                if iteration in self.ended:
                    self._adopt(self.next_members.pop(iteration, tuple(live)))
                    return self.ended.pop(iteration)
                continue
            await self._probe_all([leader])
            await self.check_in(iteration)

    def holders_of_others(self, iteration: int, live: list[str]) -> set[str]:
        """The relays the other live data nodes said hold their shares' gradients."""
        told = self.holders.get(iteration, {})
        return {relay for peer in live if peer != self.node_id for relay in told.get(peer, ())}

    async def redo_lost(
        self, iteration: int, stages: frozenset[int], live: list[str], timeout_s: float
    ) -> set[str]:
        """Have the other live data nodes redo their shares' lost gradients at ``stages``;
        the relays that hold their gradients now (one that does not answer names none)."""
        request = control.RedoLost(iteration, sum(1 << stage for stage in stages))
        holders: set[str] = set()

        async def ask(peer: str) -> None:
            try:
                reply = control.decode_reply(await control.ask(self.rpc, peer, request, timeout_s))
            except (PeerUnavailable, ProtocolError) as exc:
                log.warning("data node %s did not redo its lost gradients: %s", peer, exc)
                return
            named = reply.get("holders")
            if isinstance(named, list):
                holders.update(h for h in named if isinstance(h, str))

        async with trio.open_nursery() as nursery:
            for peer in live:
                if peer != self.node_id and peer not in self.gone:
                    nursery.start_soon(ask, peer)
        return holders

    async def announce_ended(self, iteration: int, relays_stepped: int, live: list[str]) -> None:
        """Tell the data nodes of the next iteration (``live`` and any taken in now) that the
        relays ended ``iteration``, and who they are."""
        joiners: list[str] = []
        async with trio.open_nursery() as nursery:
            for peer in sorted(self.pending):
                nursery.start_soon(self._admit, peer, joiners)
        members = tuple(sorted((set(live) - self.gone) | set(joiners)))
        message = control.IterationEnded(iteration, relays_stepped, members)
        async with trio.open_nursery() as nursery:
            for peer in members:
                if peer != self.node_id:
                    nursery.start_soon(self._tell, peer, message)
        # A member left out may be alive (it missed the probes): it hears so, and asks back in.
        # Not waited for: a dead one would hold up the next iteration.
        for peer in sorted(set(self.members) - set(members) - self.told_out):
            self.told_out.add(peer)
            if self.background is not None:
                self.background.start_soon(self._tell, peer, message)
        self._adopt(members)

    async def _admit(self, peer: str, joiners: list[str]) -> None:
        """Take ``peer`` in if it answers with a shard no live data node starts."""
        self.pending.discard(peer)
        if peer in self.restarted:
            self.restarted.discard(peer)
            await self.rpc.drop_peer(ID.from_base58(peer))
        answer = await self._shard_of(peer)
        if answer is None:
            tries = self.admit_tries.pop(peer, 0) + 1
            if tries < ADMIT_TRIES:
                self.admit_tries[peer] = tries
                self.pending.add(peer)
            log.info(
                "data node %s asked to join but did not answer (%s of %s)", peer, tries, ADMIT_TRIES
            )
            return
        self.admit_tries.pop(peer, None)
        live = {s: p for p, s in self.members.items() if p not in self.gone}
        problem = self._shard_problem(peer, *answer, {self.shard: self.node_id} | live)
        if problem is not None:
            log.warning("data node %s asked to join; refused: %s", peer, problem)
            return
        shard = answer[0]
        assert isinstance(shard, int)  # as _shard_problem checked
        self.members[peer] = shard
        joiners.append(peer)
        log.info("data node %s (shard %s) joins from the next iteration", peer, shard)

    async def _wait_for_change(self, timeout_s: float) -> bool:
        """Wait for the next message from a data node; False when none came in time."""
        with trio.move_on_after(timeout_s):
            await self._changed.wait()
            self._changed = trio.Event()
            return True
        return False

    async def check_in(self, iteration: int) -> None:
        """Raise ``LeftOut`` if another data node said or says it left this one out.

        The live ones are asked, all at once; with none live, those counted as gone are asked
        instead: two data nodes that lost touch may each have gone on alone, and the one whose
        hops the relays now refuse is the one to ask back in. A peer that does not answer is
        not asked again about this iteration, so a dead one costs one deadline at most."""
        if self.left_out_at is not None:
            raise LeftOut(self.left_out_at)
        silent = self.silent.setdefault(iteration, set())
        for old in [i for i in self.silent if i < iteration]:
            del self.silent[old]
        asked = [p for p in (self.others() or sorted(self.members)) if p not in silent]
        verdicts: list[bool] = []

        async def ask(peer: str) -> None:
            try:
                reply = control.decode_reply(
                    await control.ask(self.rpc, peer, control.Shard(), self.probe_timeout_s)
                )
            except (PeerUnavailable, ProtocolError):
                silent.add(peer)  # the probes decide about a peer that does not answer
                return
            if reply.get("left_out") is True:
                log.warning("data node %s left this one out; asking back in", peer)
                verdicts.append(True)

        async with trio.open_nursery() as nursery:
            for peer in asked:
                nursery.start_soon(ask, peer)
        if verdicts:
            raise LeftOut(iteration)

    async def _tell(self, peer: str, message: control.ControlRequest) -> None:
        for _ in range(PROBES_BEFORE_GONE):
            try:
                await control.ask(self.rpc, peer, message, self.probe_timeout_s)
                return
            except PeerUnavailable as exc:
                log.info("data node %s did not take %s: %s", peer, type(message).__name__, exc)
        # Not yet gone: the waiting loop's probes decide that.

    async def _probe_all(self, peers: list[str]) -> None:
        async def probe(peer: str) -> None:
            for _ in range(PROBES_BEFORE_GONE):
                try:
                    await control.ask(self.rpc, peer, control.Alive(), self.probe_timeout_s)
                    return
                except PeerUnavailable:
                    continue
            self.gone.add(peer)
            log.warning("data node %s stopped answering; the run goes on without its share", peer)

        async with trio.open_nursery() as nursery:
            for peer in peers:
                nursery.start_soon(probe, peer)
