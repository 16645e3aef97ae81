"""Data nodes lend idle flows to data peers whose microbatches wait: work-conserving injection.

A data node injects a microbatch only on a flow it holds, and an iteration ends when every data
node's batch is done. When batches are larger than the flows a data node holds, the last
microbatches of one data node wait for its own flows to come back while another data node that
has injected its whole batch leaves flows idle. Lending closes that gap, as a centralised
scheduler would by sharing every free path (the optimum in ``baselines/central.py`` does):

* a data node with microbatches waiting tells its data peers how many (``FlowWanted``), when the
  number grows and when it drops to zero;
* a data node with nothing waiting lends each idle source slot to the peer that waits for the
  most flows not yet lent to it (``FlowLoan``: the slot and its first hop); the borrower sends
  one microbatch there as the lender's slot, so no relay learns anything new;
* the borrower keeps a loan while it has microbatches waiting and gives it back
  (``FlowLoanReturn``) when none wait; a loan it cannot use goes back at once.

The data plane says what is idle and waiting (``announce_waiting``, ``lend_idle``,
``return_loan``); this mixin keeps who lent what. A dead or restarted peer's loans end with it.
"""

from __future__ import annotations

from collections.abc import Iterable

from gwtf.coordinator_free.protocol.base import NodeBase
from gwtf.coordinator_free.protocol.config import DATA, Outbound
from gwtf.coordinator_free.protocol.state import SlotState
from gwtf.coordinator_free.wire import FlowLoan, FlowLoanReturn, FlowWanted


class LendingMixin(NodeBase):
    # ---- the data plane's side ------------------------------------------------------------------

    def announce_waiting(self, waiting: int) -> list[Outbound]:
        """``waiting`` microbatches of mine wait for a flow: tell each data peer when it grows
        past what the peer was told, or when none wait any more (a drop in between goes unsaid:
        a loan too many comes back). A peer met later is told at the next call."""
        self.waiting_announced = waiting
        if not self.is_data:
            return []
        sends: list[Outbound] = []
        for peer in self.alive_peers(self.spec.stage):
            told = self.waiting_told.get(peer.peer_id, 0)
            if waiting > told or (waiting == 0 and told > 0):
                self.waiting_told[peer.peer_id] = waiting
                sends.append(Outbound(peer.peer_id, FlowWanted(waiting)))
        return sends

    def lend_idle(self, idle_slots: Iterable[int]) -> list[Outbound]:
        """Lend these idle source slots (the caller has nothing waiting) to waiting peers, in
        slot order (whatever order the caller keeps them in)."""
        sends: list[Outbound] = []
        for slot in sorted(idle_slots):
            out = self.out_slots.get(slot)
            borrower = self._neediest_borrower()
            if borrower is None:
                break
            usable = out is not None and out.in_key is None and out.state is SlotState.MATCHED
            if not usable or out is None or out.next_hop is None or slot in self.lent_slots:
                continue
            self.lent_slots[slot] = borrower
            sends.append(Outbound(borrower, FlowLoan(slot, out.next_hop)))
        return sends

    def return_loan(self, lender: str, slot: int) -> list[Outbound]:
        """Give back a loan (none of my microbatches waits for it any more)."""
        if self.borrowed.pop((lender, slot), None) is None:
            return []
        peer = self.peers.get(lender)
        return [Outbound(lender, FlowLoanReturn(slot))] if peer is not None and peer.alive else []

    def is_lent(self, slot: int) -> bool:
        return slot in self.lent_slots

    def recall_loans(self) -> None:
        """Take back every slot this node lent, without waiting for the borrowers: for a lender
        whose own microbatches have waited too long (a borrower that lost track of a loan would
        hold it for good). A borrower that still sends on one shares the flow meanwhile."""
        self.lent_slots.clear()

    # ---- messages -------------------------------------------------------------------------------

    def handle_flow_wanted(self, sender: str, msg: FlowWanted, now: float) -> list[Outbound]:
        if self._data_peer(sender):
            if msg.waiting > 0:
                self.waiting_peers[sender] = min(msg.waiting, self.spec.capacity)
            else:
                self.waiting_peers.pop(sender, None)
        return []

    def handle_flow_loan(self, sender: str, msg: FlowLoan, now: float) -> list[Outbound]:
        first_hop = self.peers.get(msg.first_hop)
        usable = (
            self._data_peer(sender)
            and self.waiting_announced > 0
            and len(self.borrowed) < self.spec.capacity  # bounded: a batch needs no more
            and first_hop is not None
            and first_hop.alive
            and first_hop.stage == self.next_stage
        )
        if not usable:
            return [Outbound(sender, FlowLoanReturn(msg.slot))]
        self.borrowed[(sender, msg.slot)] = msg.first_hop
        return []

    def handle_flow_loan_return(
        self, sender: str, msg: FlowLoanReturn, now: float
    ) -> list[Outbound]:
        if self.lent_slots.get(msg.slot) == sender:
            del self.lent_slots[msg.slot]
        return []

    def forget_loans(self, peer_id: str) -> None:
        """``peer_id`` died or restarted: what it borrowed is mine again, what it lent is gone."""
        self.waiting_peers.pop(peer_id, None)
        self.waiting_told.pop(peer_id, None)
        for slot in [s for s, borrower in self.lent_slots.items() if borrower == peer_id]:
            del self.lent_slots[slot]
        for key in [k for k in self.borrowed if k[0] == peer_id]:
            del self.borrowed[key]

    # ---- helpers --------------------------------------------------------------------------------

    def _data_peer(self, peer_id: str) -> bool:
        peer = self.peers.get(peer_id)
        return self.is_data and peer is not None and peer.alive and peer.role == DATA

    def _neediest_borrower(self) -> str | None:
        """The peer waiting for the most flows not yet lent to it (ties: by id)."""
        lent: dict[str, int] = {}
        for borrower in self.lent_slots.values():
            lent[borrower] = lent.get(borrower, 0) + 1
        best: tuple[int, str] | None = None
        for peer_id, waiting in self.waiting_peers.items():
            short = waiting - lent.get(peer_id, 0)
            if short > 0 and (best is None or (-short, peer_id) < (-best[0], best[1])):
                best = (short, peer_id)
        return None if best is None else best[1]
