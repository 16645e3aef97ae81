"""The swarm's epochs on its chain: the clock moved on, certificates and claims waited for, and
what the chain paid read back.

A local swarm trains for a minute, while a run's epochs last an hour and its dispute window
longer. So the swarm moves its devnet's clock: one epoch on at each of the iterations' equal
parts (``[chain] epochs``), then, once the data nodes have trained, past the last epoch's end
(the data nodes certify and submit it) and past its dispute window (the relays claim). The
data nodes read the chain's clock every ``chain.clock_period_s``: with ``pacing`` they are held
at each part's end until they have read the new epoch (``gwtf.node.swarm.pacing``), so each
epoch holds its part of the iterations however fast they run. The nodes themselves do all the
work of the epoch cycle, from their own databases and the chain.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable
from typing import Any

from gwtf.contracts.rewards import pay_wei
from gwtf.node.chain.adapter import advance_time, advance_time_to, format_eth
from gwtf.node.chain.epochs import EpochLedger
from gwtf.node.swarm.chain import SwarmChain
from gwtf.node.swarm.pacing import Pacing

SETTLE_TIMEOUT_S = 120.0
_EPOCH_HOLD = "an epoch's end"


def epoch_boundaries(iterations: int, epochs: int) -> list[int]:
    """The iteration counts after which the clock moves on one epoch."""
    return [math.ceil(k * iterations / epochs) for k in range(1, epochs)]


class SwarmEpochs:
    """Moves the swarm's chain clock through its epochs. ``certified(e)`` says whether every
    live data node has settled epochs 0..e; ``claimed()`` whether every live relay has claimed
    all it worked for; ``audit(e)`` runs for each epoch once the last is certified, while
    every epoch's dispute window is open (the swarm's run has a window of all its epochs).
    An epoch's submission window closes when the next epoch ends, so the clock never moves
    past that before the epoch is certified."""

    def __init__(
        self,
        chain: SwarmChain,
        iterations: int,
        certified: Callable[[int], bool],
        claimed: Callable[[], bool],
        audit: Callable[[int], None] = lambda epoch: None,
        pacing: Pacing | None = None,
        saw_epoch: Callable[[int], bool] = lambda epoch: True,
        timeout_s: float = SETTLE_TIMEOUT_S,
    ) -> None:
        self.chain = chain
        self.ledger = EpochLedger(chain.contracts, chain.run_id, None)
        self.boundaries = epoch_boundaries(iterations, chain.plan.epochs)
        self.certified, self.claimed, self.timeout_s = certified, claimed, timeout_s
        self.audit = audit
        self.pacing, self.saw_epoch = pacing, saw_epoch
        self._pace()

    def trained(self, iterations_done: int) -> None:
        """The data node finished ``iterations_done`` iterations: move on an epoch at a part's
        end. The next iteration starts in the next epoch (with ``pacing``, once the data nodes
        have read it)."""
        while self.boundaries and iterations_done >= self.boundaries[0]:
            boundary = self.boundaries.pop(0)
            epoch = self.current_epoch()
            self._before_closing(epoch)
            advance_time(self.chain.contracts.w3, self.chain.plan.epoch_length_s)
            if self.pacing is not None:
                seen = functools.partial(self.saw_epoch, epoch + 1)
                self.pacing.hold_until(_EPOCH_HOLD, boundary, seen)
            self._pace()

    def _pace(self) -> None:
        """Hold the data nodes at the next part's end (until ``trained`` moves the clock)."""
        if self.pacing is not None and self.boundaries:
            self.pacing.hold(_EPOCH_HOLD, self.boundaries[0])

    def current_epoch(self) -> int:
        start, length = self.ledger.run_start_and_length()
        return max(0, (self.ledger.now() - start) // length)

    def settle(self) -> int:
        """Past the last epoch's end until it is certified, past its submission deadline, each
        epoch audited, then past the
        last dispute window until every relay has claimed; returns the last epoch."""
        last = self.current_epoch()
        times = self.ledger.epoch_times(last)
        w3 = self.chain.contracts.w3
        self._before_closing(last)
        advance_time_to(w3, times.ends_at)
        _wait(lambda: self.certified(last), self.timeout_s)
        # The audit's sample is drawn from the first block after the submission deadline.
        advance_time_to(w3, times.submit_closes_at)
        for epoch in range(last + 1):
            self.audit(epoch)
        advance_time_to(w3, times.settles_at)
        _wait(self.claimed, self.timeout_s)
        return last

    def _before_closing(self, epoch: int) -> None:
        """Moving past ``epoch``'s end closes the window of the one before: wait for it."""
        if epoch > 0:
            _wait(lambda: self.certified(epoch - 1), self.timeout_s)


def _wait(done: Callable[[], bool], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not done() and time.monotonic() < deadline:
        time.sleep(0.25)


def rewards(chain: SwarmChain, last_epoch: int, names: dict[str, str]) -> dict[str, Any]:
    """Per epoch: what its certificates reserved, the certificates, what was claimed and
    whether it adds up to the wei; per node (``names``: node address to name): units and wei
    claimed, and its stake."""
    ledger = chain.contracts.ledger
    run_id = chain.run_id
    run = ledger.functions.getRun(run_id).call()
    units_per_hop, hop_price_wei = int(run[7]), int(run[13])  # Run struct fields
    epochs = []
    per_node: dict[str, dict[str, Any]] = {}
    for epoch in range(last_epoch + 1):
        book = ledger.functions.epochBook(run_id, epoch).call()
        budget_wei, total_units, _, paid_units, paid_wei, closed = book
        claims = ledger.events.RewardClaimed.get_logs(
            argument_filters={"runId": run_id, "epoch": epoch}, from_block=0
        )
        certs = ledger.events.CertificatesSubmitted.get_logs(
            argument_filters={"runId": run_id, "epoch": epoch}, from_block=0
        )
        closed_logs = ledger.events.EpochClosed.get_logs(
            argument_filters={"runId": run_id, "epoch": epoch}, from_block=0
        )
        voids = ledger.events.CertificateVoided.get_logs(
            argument_filters={"runId": run_id, "epoch": epoch}, from_block=0
        )
        claimed_wei = sum(int(c["args"]["amountWei"]) for c in claims)
        burned_wei = sum(int(r["args"]["burnedWei"]) for r in closed_logs)
        voided_wei = sum(
            pay_wei(int(v["args"]["units"]), hop_price_wei, units_per_hop) for v in voids
        )
        # Every claim is its units at the run's price.
        fair = all(
            int(c["args"]["amountWei"])
            == pay_wei(int(c["args"]["units"]), hop_price_wei, units_per_hop)
            for c in claims
        )
        epochs.append(
            {
                "epoch": epoch,
                "budget_wei": str(budget_wei),
                "certificates": {
                    c["args"]["dataNode"]: {
                        "count": c["args"]["count"],
                        "units": c["args"]["units"],
                    }
                    for c in certs
                },
                "certified_units": total_units,
                "claimed_units": paid_units,
                "claimed_wei": str(claimed_wei),
                "unclaimed_wei": str(budget_wei - claimed_wei - burned_wei),
                # Reserved and never paid: what the epoch left unclaimed when it closed.
                "burned_wei": str(burned_wei),
                # What voided certificates had reserved (burned, out of the budget above).
                "voided_wei": str(voided_wei),
                "closed": closed,
                # Every claim is its units at the run's price, the claims are what the ledger
                # paid, and paid + burned + still claimable is the budget, to the wei.
                "adds_up": fair
                and claimed_wei == paid_wei
                and (not closed or claimed_wei + burned_wei == budget_wei),
            }
        )
        for claim in claims:
            name = names.get(claim["args"]["node"], claim["args"]["node"])
            entry = per_node.setdefault(name, {"units": 0, "reward_wei": 0})
            entry["units"] += int(claim["args"]["units"])
            entry["reward_wei"] += int(claim["args"]["amountWei"])
    registry = chain.contracts.registry
    for name, node in chain.registered.items():
        entry = per_node.setdefault(name, {"units": 0, "reward_wei": 0})
        entry["stake_wei"] = str(registry.functions.getNode(node.node_address).call()[1])
    for entry in per_node.values():
        entry["reward_eth"] = format_eth(entry["reward_wei"])
        entry["reward_wei"] = str(entry["reward_wei"])
    return {"epochs": epochs, "nodes": per_node}
