"""Admission: a peer is served only if the chain has its node in the run, active and staked.

A peer's libp2p id embeds its secp256k1 key, whose Ethereum address is the node on chain
(``gwtf.node.p2p.identity.node_address_of_peer``): the registry binds exactly that key, so a peer
cannot pass for another node, and a peer whose id embeds no such key is no node at all.

The chain port answers from a snapshot of chain state (web3 in a worker thread, since its calls
block); answers are cached for ``cache_s`` so a busy peer costs one chain call per period, and a
peer that unstakes or is slashed loses access within about that period. Refusals are logged.

Two rules keep the chain off the data path: a lookup is shared by every request of that peer
that arrives while it runs (a burst of hop streams costs one chain call, not one each), and an
admitted peer whose answer has aged is still served while a background lookup refreshes it, so
a hop never waits for the chain once its sender has been admitted. A refused peer is looked up
again before it is served, since it may have registered meanwhile.

Fresh peer ids cost nothing to make, so the chain lookups of peers not admitted (new ones,
refused ones whose answer aged) share one budget (``lookups``: a few per second, a short
burst): over it, a peer is refused unchecked and not remembered, so it is looked up once the
flood passes. A flood of fresh identities then costs the chain a bounded number of calls per
second instead of one per identity; admitted peers are never held up by it. Refusals are
remembered for at most ``MAX_REMEMBERED_REFUSALS`` peers (the oldest forgotten first).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass, field

import trio
from libp2p.peer.id import ID

from gwtf.errors import ChainError, ProtocolError
from gwtf.node.chain.adapter import ChainPort
from gwtf.node.p2p.identity import node_address_of_peer
from gwtf.node.p2p.rpc import PublicRate

log = logging.getLogger(__name__)

MAX_REMEMBERED_REFUSALS = 10_000
#: How often the count of peers refused unchecked (over the lookup budget) is logged, at most.
UNCHECKED_LOG_S = 10.0


@dataclass
class RunAdmission:
    chain: ChainPort
    run_id: int
    cache_s: float = 30.0
    #: peer -> (member, when the chain said so, in trio time)
    _cache: OrderedDict[str, tuple[bool, float]] = field(default_factory=OrderedDict)
    #: The chain lookups of peers not admitted, all of them together.
    lookups: PublicRate = field(default_factory=lambda: PublicRate(per_s=5.0, burst=20.0))
    #: Peers refused unchecked since the count was last logged, and when it was.
    unchecked: int = 0
    _unchecked_logged_at: float = -UNCHECKED_LOG_S
    #: peer -> set when its lookup in flight ends
    _pending: dict[str, trio.Event] = field(default_factory=dict)
    _limiter: trio.CapacityLimiter = field(default_factory=lambda: trio.CapacityLimiter(2))
    #: Peers the chain named data nodes of the run: for good (the ledger never takes it back).
    _data_nodes: set[str] = field(default_factory=set)
    #: peer -> set when its data-node lookup in flight ends
    _data_pending: dict[str, trio.Event] = field(default_factory=dict)

    async def __call__(self, peer: str) -> bool:
        cached = self._cache.get(peer)
        if cached is not None:
            member, checked_at = cached
            if trio.current_time() - checked_at < self.cache_s:
                return member
            if member:
                if peer not in self._pending:
                    # Registered now, not when the task first runs: a request arriving before
                    # then must not start a second lookup.
                    self._pending[peer] = trio.Event()
                    trio.lowlevel.spawn_system_task(self._refresh, peer)
                return True
        if peer not in self._pending:
            if not self.lookups.take(trio.current_time()):
                self._refused_unchecked()
                return False
            self._pending[peer] = trio.Event()
            await self._look_up(peer)
        else:
            await self._pending[peer].wait()
        answer = self._cache.get(peer)
        # No answer: the chain could not be asked. Fail closed, and ask again next time.
        return answer is not None and answer[0]

    async def is_data_node(self, peer: str) -> bool | None:
        """Whether ``peer`` is a data node of the run, as a forward's origin must be: True once
        the chain said so (never asked again), False when it says not (or ``peer`` is no node's
        id), None when it cannot be asked now (no answer, or over the lookup budget of peers not
        admitted): the caller then declines without blaming anyone. Lookups of one peer in
        flight together are one chain call."""
        if peer in self._data_nodes:
            return True
        pending = self._data_pending.get(peer)
        if pending is not None:
            await pending.wait()
            return True if peer in self._data_nodes else None
        if not self.lookups.take(trio.current_time()):
            self._refused_unchecked()
            return None
        done = self._data_pending[peer] = trio.Event()
        try:
            node = node_address_of_peer(ID.from_base58(peer))
            named = await trio.to_thread.run_sync(
                self.chain.is_data_node, self.run_id, node, limiter=self._limiter
            )
        except (ProtocolError, ValueError):
            return False
        except ChainError as exc:
            log.warning("cannot ask the chain whether %s is a data node (%s)", peer, exc)
            return None
        finally:
            self._data_pending.pop(peer, None)
            done.set()
        if named:
            self._data_nodes.add(peer)
        return named

    def _refused_unchecked(self) -> None:
        self.unchecked += 1
        now = trio.current_time()
        if now - self._unchecked_logged_at >= UNCHECKED_LOG_S:
            log.warning(
                "refused %s peer(s) without asking the chain: over its budget of %g lookups/s "
                "of peers not admitted (a flood of fresh identities?); they are looked up later",
                self.unchecked,
                self.lookups.per_s,
            )
            self.unchecked, self._unchecked_logged_at = 0, now

    def _remember(self, peer: str, member: bool) -> None:
        self._cache[peer] = (member, trio.current_time())
        self._cache.move_to_end(peer)
        if not member:
            refused = [p for p, (m, _) in self._cache.items() if not m]
            for old in refused[: max(0, len(refused) - MAX_REMEMBERED_REFUSALS)]:
                del self._cache[old]

    async def _refresh(self, peer: str) -> None:
        # A system task: an exception escaping it would end the whole node, so none may.
        try:
            await self._look_up(peer)
        except Exception:
            log.exception("refreshing the admission of %s failed; it is asked again later", peer)
            self._cache.pop(peer, None)

    async def _look_up(self, peer: str) -> None:
        """Ask the chain once for ``peer`` (its ``_pending`` event is registered); every caller
        waiting on it reads the cache after."""
        done = self._pending[peer]
        try:
            node = node_address_of_peer(ID.from_base58(peer))
            member = await trio.to_thread.run_sync(
                self.chain.is_admitted, self.run_id, node, limiter=self._limiter
            )
        except ProtocolError as exc:
            log.warning("refused peer %s: %s", peer, exc)
            self._remember(peer, False)
        except (ChainError, ValueError) as exc:
            # Not remembered: the chain may be back at the next request. A stale admission is
            # dropped too, so a peer is not served for ever on an answer that can't be renewed.
            log.warning("cannot check peer %s on chain (%s); refusing it for now", peer, exc)
            self._cache.pop(peer, None)
        else:
            if not member:
                log.warning(
                    "refused peer %s: not a staked node of run %s on chain", peer, self.run_id
                )
            self._remember(peer, member)
        finally:
            self._pending.pop(peer, None)
            done.set()
