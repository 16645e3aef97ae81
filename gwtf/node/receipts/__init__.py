"""Receipts of live work: recorded on every hop, signed and countersigned in batches, reported
to the data node, certified per epoch on chain, and claimed (``book``, ``recording``,
``batching``, ``reports``, ``certify``, ``epochs``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from gwtf.node.chain.epochs import EpochLedger
from gwtf.node.receipts.batching import BatchSettings
from gwtf.node.receipts.book import ReceiptTerms


@dataclass(frozen=True)
class ReceiptsConfig:
    """What a live node needs to keep receipts and take part in the epoch cycle."""

    terms: ReceiptTerms
    db_url: str
    #: The run's ledger; its wallet submits a data node's certificates (the sponsor's) or a
    #: worker's claims. Without a wallet the node keeps receipts but sends no transaction.
    ledger: EpochLedger
    #: How often a relay sends the complete receipts it holds to their data nodes (a report is one
    #: request each; fewer is cheaper), and how long a data node waits after an epoch's last
    #: iteration for the last reports: at least its batches' settling and a report period
    #: (``grace_for``), so an honest pair's receipt is never too late to be paid.
    report_period_s: float = 5.0
    grace_s: float = 0.0  # 0: ``grace_for``
    clock_period_s: float = 2.0
    #: A cheat this node plays on purpose (``gwtf.node.receipts.cheats``); "" is honest.
    cheat: str = ""
    #: A relay's hop evidence for auditors (``gwtf.node.store.evidence``): where, "" for nowhere,
    #: and of how many recent epochs' hops it is kept (it goes once settled and undisputed).
    evidence_dir: str = ""
    evidence_epochs: int = 2
    #: A worker claims each settled epoch by itself; off, only when asked (``claim_now``).
    auto_claim: bool = True
    #: When a worker closes its batches of receipts (``gwtf.node.receipts.batching``).
    batches: BatchSettings = field(default_factory=BatchSettings)

    def __post_init__(self) -> None:
        least = grace_for(self.batches, self.report_period_s)
        if not self.grace_s:
            object.__setattr__(self, "grace_s", least)
        elif self.grace_s < least:
            raise ValueError(
                f"grace_s {self.grace_s} is shorter than its batches settle and a report "
                f"period take ({least} s): an honest hop could go unpaid"
            )


def grace_for(batches: BatchSettings, report_period_s: float) -> float:
    """The shortest report grace a data node may keep: an honest pair's receipt settles
    (``BatchSettings.settled_within_s``) and is reported (within two report periods) before
    it ends."""
    return batches.settled_within_s + 2 * report_period_s + 1.0
