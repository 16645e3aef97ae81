"""Admission: a peer is served only if the chain binds its libp2p id to a staked node of the run.

The chain port answers from a snapshot of chain state (web3 in a worker thread, since its calls
block); answers are cached for ``cache_s`` so a busy peer costs one chain call per period, and a
peer that unstakes or is slashed loses access within that period. Refusals are logged.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import trio
from libp2p.peer.id import ID

from gwtf.errors import ChainError
from node.chain import ChainPort

log = logging.getLogger(__name__)


@dataclass
class RunAdmission:
    chain: ChainPort
    run_id: int
    cache_s: float = 30.0
    _cache: dict[str, tuple[bool, float]] = field(default_factory=dict)
    _limiter: trio.CapacityLimiter = field(default_factory=lambda: trio.CapacityLimiter(2))

    async def __call__(self, peer: str) -> bool:
        now = trio.current_time()
        cached = self._cache.get(peer)
        if cached is not None and now - cached[1] < self.cache_s:
            return cached[0]
        try:
            peer_bytes = ID.from_base58(peer).to_bytes()
            member = await trio.to_thread.run_sync(
                self.chain.is_run_member, self.run_id, peer_bytes, limiter=self._limiter
            )
        except ChainError as exc:
            # Fail closed, but do not remember it: the chain may be back at the next request.
            log.warning("cannot check peer %s on chain (%s); refusing it for now", peer, exc)
            return False
        if not member:
            log.warning("refused peer %s: not a staked node of run %s on chain", peer, self.run_id)
        self._cache[peer] = (member, now)
        return member
