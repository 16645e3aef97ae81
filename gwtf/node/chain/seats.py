"""Who sits on a jury about this node now, read from the court: the peers its receipts and
evidence servers answer outside the shared outsider rate (``gwtf.node.p2p.rpc.PublicRate``).

A juror dials the accused with its node key, so its peer id names its juror node
(``node_address_of_peer``); the accused admits it while the chain says that node holds a seat
of a round, drawn in a case whose accused is this node, whose commit window (when jurors fetch
evidence) is open, give or take ``SLACK_BLOCKS`` for providers a few blocks apart. Nothing the
peer sends is trusted. The seats come from the court's ``JuryDrawn`` logs of the last commit
window, read incrementally (the last ``REORG_BLOCKS`` again at each reading, so a draw a
reorganisation took out seats no one); each case's accused is read once (``getCase``) and
cached, a bounded number of them. A forwarder (``/gwtf/evidence-via``, ``/gwtf/receipts-via``:
how a juror reaches a relay at home) admits so the seated jurors of any case whose accused is
in its own run (a member or data node of it when the case is first seen), each within its own
rate: a case about another run's node seats nobody whom this forwarder would pass on to its
accused. A data node admits the same on its receipts (its certificate, which a juror checks
the disputed leaf and the hop's replicas against, whichever node of its run is accused). The
chain is read on demand, at most once per ``MIN_REFRESH_S`` whoever asks (a flood of made-up
peer ids costs one read a period), and at least once per ``MAX_AGE_S`` while peers ask, so a
seat that ended stops counting.
"""

from __future__ import annotations

import logging
from typing import Final

import trio
from libp2p.peer.id import ID

from gwtf.errors import ProtocolError
from gwtf.node.chain.actions import Contracts
from gwtf.node.chain.holds import logs_since
from gwtf.node.p2p.identity import node_address_of_peer

#: Blocks past a round's commit window its jurors are still admitted (providers lag).
SLACK_BLOCKS: Final = 4
#: Blocks read again at each reading: a draw a reorganisation took out (or put in again, in
#: another block, with other seats) is then forgotten (or seen), not kept for its window.
REORG_BLOCKS: Final = 64
MIN_REFRESH_S: Final = 1.0
MAX_AGE_S: Final = 15.0
#: Cases whose accused is kept (each read once); past it the cache starts afresh.
MAX_CASES: Final = 4096

log = logging.getLogger(__name__)


class CourtSeats:
    """The seated jurors of the open rounds of cases about ``node`` (a ``Seats``); with
    ``node`` None, of any case whose accused is in run ``run_id`` (a forwarder's: it passes
    requests on to its run's relays at home, any of which may be accused)."""

    def __init__(self, contracts: Contracts, node: str | None, run_id: int | None = None) -> None:
        if (node is None) == (run_id is None):
            raise ValueError("court seats are about one node, or about the nodes of one run")
        self._court = contracts.court
        self._ledger = contracts.ledger
        self._run_id = run_id
        self._w3 = contracts.w3
        self._node = None if node is None else node.lower()
        self._window: int | None = None
        self._next_block = 0
        self._accused: dict[int, bool] = {}
        #: (case, round) -> (the block it was drawn in, its seated nodes)
        self._rounds: dict[tuple[int, int], tuple[int, frozenset[str]]] = {}
        self._seated: frozenset[str] = frozenset()
        self._read_at = -float("inf")
        self._lock = trio.Lock()

    async def holds(self, peer: str) -> bool:
        try:
            node = node_address_of_peer(ID.from_base58(peer)).lower()
        except (ProtocolError, ValueError):
            return False  # no node key in that id: no juror
        age_s = MAX_AGE_S if node in self._seated else MIN_REFRESH_S
        if trio.current_time() - self._read_at >= age_s:
            async with self._lock:  # callers meanwhile wait for this one reading
                if trio.current_time() - self._read_at >= age_s:
                    await self._read()
        return node in self._seated

    async def _read(self) -> None:
        try:
            await trio.to_thread.run_sync(self._read_chain)
        except Exception as exc:  # supervision boundary: any failure of the provider (web3's
            # own errors too: an RPC error reply, a range cap) keeps the last seats. Escaping,
            # it would fail the asking peer's stream, charged to that peer (a run member's
            # evidence read too), and the next request would read the chain again at once.
            log.warning("seated jurors not read from the court (%r); keeping the last", exc)
        finally:
            self._read_at = trio.current_time()

    def _read_chain(self) -> None:
        if self._window is None:
            self._window = int(self._court.functions.phaseBlocks().call())
        latest = int(self._w3.eth.block_number)
        oldest = latest - self._window - SLACK_BLOCKS  # drawn before it: the window is over
        first = max(self._next_block - REORG_BLOCKS, oldest, 0)
        # What was read from ``first`` on is read again, whatever a reorganisation did to it.
        rounds = {k: v for k, v in self._rounds.items() if oldest <= v[0] < first}
        for drawn in logs_since(self._court.events.JuryDrawn, first, latest):
            case_id, r = int(drawn["args"]["caseId"]), int(drawn["args"]["round"])
            if self._about_me(case_id):
                seats = frozenset(str(seat).lower() for seat in drawn["args"]["seats"])
                rounds[(case_id, r)] = (int(drawn["blockNumber"]), seats)
        self._rounds, self._next_block = rounds, latest + 1
        self._seated = frozenset().union(*(seats for _, seats in rounds.values()))

    def _about_me(self, case_id: int) -> bool:
        if case_id not in self._accused:
            if len(self._accused) >= MAX_CASES:
                self._accused.clear()
            accused = str(self._court.functions.getCase(case_id).call()[0][0])
            self._accused[case_id] = self._mine(accused)
        return self._accused[case_id]

    def _mine(self, accused: str) -> bool:
        if self._run_id is None:
            return accused.lower() == self._node
        ledger = self._ledger.functions
        if ledger.isAdmitted(self._run_id, accused).call():
            return True
        return bool(ledger.wasDataNodeBefore(self._run_id, accused, 2**256 - 1).call())
