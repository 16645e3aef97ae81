"""A relay started without a stage (``node.stage = -1``) takes the run's bottleneck stage.

Before it builds its stage worker, the relay asks its bootstrap peers which nodes of the run they
know, at which stage, with what capacity and spare capacity (the control protocol's ``loads``),
then asks the nodes they named, a few rounds deep: every node knows the live replicas of the
stages next to its own, so a handful of answers covers the pipeline. The placement rule is the
flow core's (``gwtf.coordinator_free.placement.choose_bottleneck``): the stage with the least live
capacity, weighted by speed, for the flows the data nodes need, where a new replica raises the
swarm's throughput most. Only nodes that answer count, so a dead replica adds nothing; flows
carried at the moment are not read (a stage that lost a replica carries fewer of them).

Relays that start together would each see the same loads and take the same stage. So a data
node answering a relay that does not serve yet notes the stage the placement rule gives it, and
tells the next askers of it for ``RESERVED_S`` or until that relay serves (``Reservations``;
its entry's address is ``control.JOINING_ADDRESS``): they count it as a replica of capacity 1,
believing it only of their bootstrap peers, so no other node can invent replicas this way.

Peers are untrusted: what a node says of others only tells the relay whom to ask next. The
capacities it places by are what each node said of itself, so a lying peer can misstate one
node's (its own, bounded by the wire limits) but cannot invent replicas or stages. Nor can it
hide a node by naming it at a wrong address: every address named for a node is tried (a few per
node) until it answers.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Collection
from dataclasses import dataclass, field

import trio

from gwtf.coordinator_free.placement import JoinDecision, choose_bottleneck
from gwtf.errors import ConfigError, ProtocolError
from gwtf.node.p2p.host import peer_info
from gwtf.node.p2p.rpc import RequestResponse
from gwtf.node.runtime.dataplane import control

log = logging.getLogger(__name__)

#: Rounds of asking the nodes the previous answers named, and nodes asked in all.
MAX_ROUNDS = 4
MAX_ASKED = 32
#: Addresses kept per node named by others: a rogue naming a wrong one cannot hide it.
MAX_ADDRESSES_PER_NODE = 4


#: How long a data node counts a relay it told the loads to as joining its stage.
RESERVED_S = 60.0
#: Reservations a data node keeps, and a relay counts from one answer.
MAX_RESERVED = 32


@dataclass
class Reservations:
    """A data node's note of the relays it told the run's loads to, each with the stage the
    placement rule gives it, until it serves or ``RESERVED_S`` passes."""

    stages: int
    held: dict[str, tuple[control.LoadEntry, float]] = field(default_factory=dict)

    def answer(
        self, asker: str, entries: list[control.LoadEntry], now: float
    ) -> list[control.LoadEntry]:
        """``entries`` (the loads this node knows) and the reservations of relays other than
        ``asker``; ``asker``, if it does not serve yet, gets a reservation of its own."""
        serving = {e.peer_id for e in entries}
        self.held = {
            p: (entry, until)
            for p, (entry, until) in self.held.items()
            if until > now and p not in serving
        }
        others = [entry for p, (entry, _) in self.held.items() if p != asker]
        if asker not in serving and asker not in self.held and len(self.held) < MAX_RESERVED:
            relays = [e for e in entries + others if 1 <= e.stage <= self.stages]
            demand = sum(e.capacity for e in entries if e.stage == 0)
            stage = choose_bottleneck(
                self.stages, [(e.stage, e.capacity, e.compute_ms) for e in relays], demand
            ).stage
            joining = control.LoadEntry(asker, control.JOINING_ADDRESS, stage, 1, 1, 1.0)
            self.held[asker] = (_reserved(joining), now + RESERVED_S)
        return entries + others


#: The compute time a reservation is counted with: the joiner has said nothing of itself.
DEFAULT_COMPUTE_MS = 100.0


def _reserved(entry: control.LoadEntry) -> control.LoadEntry:
    return control.LoadEntry(
        entry.peer_id, control.JOINING_ADDRESS, entry.stage, 1, 1, DEFAULT_COMPUTE_MS
    )


@dataclass(frozen=True)
class Placement:
    decision: JoinDecision
    #: The chosen stage's replicas that answered or were named: whom to ask for its state.
    replicas: tuple[control.LoadEntry, ...]


class NoAnswer(ProtocolError):
    """No node of the run answered: its data node may not serve yet."""


#: A relay waiting for the run tries again after this, doubling up to the cap.
FIRST_RETRY_S = 1.0
MAX_RETRY_S = 15.0


async def wait_for_placement(
    rpc: RequestResponse,
    bootstrap: tuple[str, ...],
    stages: int,
    timeout_s: float,
    patience_s: float = math.inf,
    allowed: Collection[int] | None = None,
) -> Placement:
    """``choose_join_stage``, tried again with backoff while no node of the run answers (its
    data node not started yet, or restarting), for up to ``patience_s`` (inf: until cancelled),
    so that a relay may start before the data node it bootstraps from."""
    delay_s, since = FIRST_RETRY_S, trio.current_time()
    while True:
        try:
            return await choose_join_stage(rpc, bootstrap, stages, timeout_s, allowed)
        except NoAnswer:
            if trio.current_time() - since + delay_s > patience_s:
                raise
        log.warning(
            "waiting for the data node at %s: no node of the run answers yet; trying again in "
            "%.0f s", ", ".join(bootstrap), delay_s,
        )  # fmt: skip
        await trio.sleep(delay_s)
        delay_s = min(MAX_RETRY_S, 2 * delay_s)


async def choose_join_stage(
    rpc: RequestResponse,
    bootstrap: tuple[str, ...],
    stages: int,
    timeout_s: float,
    allowed: Collection[int] | None = None,
) -> Placement:
    """The bottleneck stage of the run, as the nodes reachable from ``bootstrap`` see it
    (``timeout_s``: each request's deadline), among the ``allowed`` stages (those that fit
    this node's memory; None: every stage)."""
    if not bootstrap:
        raise ConfigError("node.stage = -1 needs p2p.bootstrap_peers to learn the run's loads")
    known: dict[str, control.LoadEntry] = {}  # what nodes said of themselves
    joining: dict[str, control.LoadEntry] = {}  # relays data nodes said are joining
    # Where nodes are, as the bootstrap list and the answers named them: whom to ask.
    named: dict[str, list[str]] = {}
    for address in bootstrap:
        named.setdefault(str(peer_info(address).peer_id), []).append(address)
    # Only the bootstrap peers (the run's data nodes, as the sponsor publishes them) are
    # believed about relays joining: another node could invent them.
    vouching = frozenset(named)
    own = str(rpc.host.get_id())
    tried: set[str] = set()  # addresses asked
    asked: set[str] = set()  # nodes asked, at one address or more
    with trio.move_on_after(MAX_ROUNDS * timeout_s):
        for _ in range(MAX_ROUNDS):
            # One untried address per node that has not answered yet.
            frontier = [
                (p, next(a for a in named[p] if a not in tried))
                for p in sorted(named)
                if p != own and p not in known and any(a not in tried for a in named[p])
            ][: MAX_ASKED - len(tried)]
            if not frontier:
                break
            async with trio.open_nursery() as nursery:
                for peer_id, address in frontier:
                    asked.add(peer_id)
                    tried.add(address)
                    nursery.start_soon(
                        _ask, rpc, address, known, joining, named, vouching, timeout_s
                    )
    relays = [e for e in known.values() if 1 <= e.stage <= stages]
    counted = relays + [
        e for p, e in joining.items() if p != own and p not in known and 1 <= e.stage <= stages
    ]
    if not relays and not any(e.stage == 0 for e in known.values()):
        raise NoAnswer(
            f"none of the {len(asked)} nodes asked told this relay the run's loads; check "
            "p2p.bootstrap_peers, or set node.stage"
        )
    # The flows the run needs: a slot per unit of each data node's capacity.
    demand = sum(e.capacity for e in known.values() if e.stage == 0)
    decision = choose_bottleneck(
        stages, [(e.stage, e.capacity, e.compute_ms) for e in counted], demand, allowed
    )
    log.info("joining stage %s: %s (%s nodes asked)", decision.stage, decision.reason, len(asked))
    return Placement(decision, tuple(e for e in relays if e.stage == decision.stage))


async def _ask(
    rpc: RequestResponse,
    address: str,
    known: dict[str, control.LoadEntry],
    joining: dict[str, control.LoadEntry],
    named: dict[str, list[str]],
    vouching: frozenset[str],
    timeout_s: float,
) -> None:
    try:
        info = peer_info(address)  # a peer may have named a malformed one
    except ConfigError as exc:
        log.info("a peer named a bad address: %s", exc)
        return
    try:
        # Dial this address alone: a wrong one a rogue named earlier would hide the node.
        # A peer may name addresses where nothing answers: the dial gets the deadline.
        with trio.fail_after(timeout_s):
            await rpc.dialer.connect(info.peer_id, info.addrs)
        reply = await control.ask(rpc, info.peer_id, control.Loads(), timeout_s)
        entries = control.decode_loads(reply)
    except ProtocolError as exc:
        log.info("loads from %s: %s", info.peer_id, exc)
        return
    except Exception as exc:  # libp2p's dial errors have no common base worth naming
        log.info("could not dial %s: %s", address, exc)
        return
    answering = str(info.peer_id)
    for entry in entries:
        if entry.peer_id == answering:
            known[answering] = entry
        elif entry.address == control.JOINING_ADDRESS:
            # A bootstrap data node's reservation counts as a replica of capacity 1 at the
            # usual speed, whatever figures it came with.
            if answering in vouching and len(joining) < MAX_RESERVED:
                joining.setdefault(entry.peer_id, _reserved(entry))
        elif entry.address.endswith(f"/p2p/{entry.peer_id}"):  # else it names someone else
            addresses = named.setdefault(entry.peer_id, [])
            if entry.address not in addresses and len(addresses) < MAX_ADDRESSES_PER_NODE:
                addresses.append(entry.address)
