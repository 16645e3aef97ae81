"""The flows a data node starts its microbatches on: its own source slots, and slots another
data node lends it while its microbatches wait (the flow core's lending, live).

An iteration ends when every data node's batch is done. A data node whose flows are few or slow
would hold everyone up while another, done with its batch, leaves its flows idle; so (as in the
simulator, ``gwtf/coordinator_free/protocol/lending.py``):

* a data node starts each microbatch on the free flow ``decisions.choose_flow`` gives (its own
  carried flows, cheapest reported path first, then loans), as the simulator does; a slot not
  carried is taken only when the node carries no flow at all and the microbatch has waited
  ``FLOWLESS_PATIENCE_PERIODS`` (it then goes off any flow at its first hop);
* a data node whose next microbatch finds no free flow tells its data peers how many wait
  (``announce_waiting``, again each flow tick for a peer met or restarted since); once all its
  microbatches of the iteration are started, that none do;
* a data node with nothing waiting lends each free slot of its own to the peer waiting for the
  most (``lend_idle``): at once when a peer says it waits, and whenever one of its slots frees;
* a borrower starts a waiting microbatch on the loan (the hop names the lender, whose slot it
  is: ``HopHeader.lender``), keeps the loan while microbatches wait and gives it back
  (``return_loan``) when none do, or when it no longer can use it;
* a lent slot is the borrower's until it comes back (``FlowLoanReturn``), across iterations;
  a lender whose own microbatch has waited ``RECALL_PERIODS`` for a flow takes its lent slots
  back (``decisions.take_back_loans``, ``recall_loans``), as in the simulator: a borrower that
  lost track of one would otherwise hold it for good.

The core keeps who lent what to whom; this pool keeps which flows are free now.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import trio

from gwtf.coordinator_free.decisions import (
    FlowKey,
    FreeFlow,
    choose_flow,
    lent_flow,
    own_flow,
    take_back_loans,
)
from gwtf.coordinator_free.wire import FlowLoan, FlowLoanReturn, FlowWanted, Message
from gwtf.node.runtime.flow.service import FlowService


@dataclass(frozen=True)
class Flow:
    """A flow slot a microbatch can start on: this node's own, or one a ``lender`` lent."""

    slot: int
    lender: str = ""


class FlowPool:
    def __init__(self, flow: FlowService) -> None:
        self.flow = flow
        self.node = flow.node
        self._free: list[Flow] = []
        self._in_use: set[Flow] = set()
        self._changed = trio.Event()
        self._starting = False  # its microbatches of the iteration are not all started yet

    # ---- the data node's side --------------------------------------------------------------

    def open(self, data_peers: Iterable[str] | None = None) -> None:
        """A new iteration: every own slot is free unless it is lent or still in use. Slots lent
        to a borrower no longer among ``data_peers`` (it died: no keep-alive watches data
        peers, so the core would not know) are taken back."""
        if data_peers is not None:
            members = set(data_peers)
            for borrower in set(self.node.lent_slots.values()) - members:
                self.node.forget_loans(borrower)
        own = [Flow(slot) for slot in sorted(self.node.out_slots)]
        self._free = [f for f in own if f not in self._in_use and not self.node.is_lent(f.slot)]
        self._starting = True
        self._notify()

    async def take(self, waiting: int) -> Flow:
        """A free flow for the next microbatch; ``waiting`` of this node's microbatches (this
        one included) have none yet: the data peers are told while it waits."""
        asked = trio.current_time()
        while True:
            changed = self._changed
            waited_periods = (trio.current_time() - asked) / self.node.period_s
            if take_back_loans(waited_periods) and self.node.lent_slots:
                self.node.recall_loans()
            self._reclaim()
            flow = self._pop_free(waited_periods)
            if flow is not None:
                self._in_use.add(flow)
                return flow
            # Said again each flow tick: the core tells each data peer once per number, so
            # only a peer met or restarted since (told nothing yet) hears it. Looked at again
            # then too: flows get carried (and a flowless node's patience runs out) unannounced.
            self.flow.dispatch(self.node.announce_waiting(waiting))
            with trio.move_on_after(self.flow.tick_s):
                await changed.wait()

    def first_hop(self, flow: Flow) -> str | None:
        """Where a lent flow starts (None once the loan ended: the lender died)."""
        return self.node.borrowed.get((flow.lender, flow.slot))

    def release(self, flow: Flow, still_to_start: int) -> None:
        """``flow``'s microbatch is done; ``still_to_start`` of this iteration's are not started."""
        self._in_use.discard(flow)
        if flow.lender:
            if still_to_start and (flow.lender, flow.slot) in self.node.borrowed:
                self._put(flow)
            else:
                self.flow.dispatch(self.node.return_loan(flow.lender, flow.slot))
            return
        self._put(flow)
        if not still_to_start:
            self._lend_idle()

    def all_started(self) -> None:
        """Every microbatch of the iteration is started: nothing waits; idle loans go back and
        idle own slots may be lent."""
        self._starting = False
        self.flow.dispatch(self.node.announce_waiting(0))
        for flow in [f for f in self._free if f.lender]:
            self._free.remove(flow)
            self.flow.dispatch(self.node.return_loan(flow.lender, flow.slot))
        self._lend_idle()

    # ---- news from data peers (after the core handled it) ----------------------------------

    def heard(self, sender: str, message: Message) -> None:
        if isinstance(message, FlowLoan):
            if (sender, message.slot) in self.node.borrowed:  # the core took it: it is usable
                self._put(Flow(message.slot, sender))
        elif isinstance(message, FlowLoanReturn):
            flow = Flow(message.slot)
            back = not self.node.is_lent(message.slot) and message.slot in self.node.out_slots
            if back and flow not in self._free and flow not in self._in_use:
                self._put(flow)
                self._lend_idle()
        elif isinstance(message, FlowWanted):
            self._lend_idle()

    # ---- helpers ------------------------------------------------------------------------------

    def _pop_free(self, waited_periods: float = 0.0) -> Flow | None:
        """The free flow ``decisions.choose_flow`` gives: an own carried flow first, cheapest
        reported path first, then a loan that is still held (a dead lender's loans end),
        nearest first hop first; a slot not carried once the node carries no flow at all and
        the microbatch waited ``waited_periods`` long enough."""
        source = self.node.source_routes()
        by_key: dict[FlowKey, Flow] = {}
        free: list[FreeFlow] = []
        for flow in list(self._free):
            if flow.lender:
                first_hop = self.first_hop(flow)
                if first_hop is None:  # the loan ended
                    self._free.remove(flow)
                    continue
                seen = lent_flow(self.node, flow.lender, flow.slot, first_hop)
            else:
                seen = own_flow(self.node, flow.slot, source.get(flow.slot, (None,))[0])
            by_key[seen.key] = flow
            free.append(seen)
        carries_none = not self.node.borrowed and all(self.node.is_lent(s) for s in source)
        chosen = choose_flow(free, carries_none, waited_periods)
        if chosen is None:
            return None
        pick = by_key[chosen]
        self._free.remove(pick)
        return pick

    def _reclaim(self) -> None:
        """Own slots neither free, in use nor lent are free again: their borrower died or
        restarted mid-iteration, and the core ended its loans (no ``FlowLoanReturn`` comes)."""
        for slot in self.node.out_slots:
            flow = Flow(slot)
            if flow not in self._in_use and flow not in self._free and not self.node.is_lent(slot):
                self._free.append(flow)

    def _lend_idle(self) -> None:
        """Lend free own slots to waiting peers (the core picks whom, and skips unusable ones),
        once this node's own microbatches of the iteration are all started."""
        if self._starting or not self.node.waiting_peers:
            return
        idle = [f.slot for f in self._free if not f.lender]
        self.flow.dispatch(self.node.lend_idle(idle))
        self._free = [f for f in self._free if f.lender or not self.node.is_lent(f.slot)]

    def _put(self, flow: Flow) -> None:
        self._free.append(flow)
        self._notify()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()
