"""A node dishonest on purpose, in one named way (``node.cheat``), so that the auditor and the
fraud proofs are tested against real fraud, and the demo has a cheater to catch. Off unless
set; a node with a cheat says so in its log at start, as a warning.

A data node's cheats change what it certifies or serves:

* ``forge-countersignature``: the first hop it certifies each epoch carries a countersignature
  it made with a key of its own, as if a hop nobody acknowledged had been;
* ``phantom-hops``: it certifies hops it never sent anyone, in its own name as their worker
  (it signs and countersigns them itself) — work nobody computed;
* ``inflate-units``: its certificate claims one forward's units more than its tree holds;
* ``shift-span``: the spans it commits move its first worker's last leaf into the next
  worker's span (a valid tree that neither worker could claim);
* ``withhold-leaf``: it serves its certificate to auditors without its first leaf (its first
  page one leaf short of full, of the whole total).

A relay's change what it signs:

* ``claim-twice``: for the first hop it computes each epoch it signs a second receipt under the
  same hop key (another output digest), reports it to the data node and serves it with its
  receipts;
* ``equivocate``: for the first hop it receives each epoch it countersigns a second version of
  its receipt, and serves it with the receipts it received;
* ``wrong-tensor``: every forward output it sends is its stage's true output scaled by
  ``1 + WRONG_TENSOR_SCALE`` (a small error, as a relay saving work with a cheaper kernel might
  make); it signs and keeps what it sent, like an honest relay.

The chain convicts the first four and the next two alone (invalid hop, bad totals, bad span,
equivocation); a withheld leaf is the auditor's to report, since no contract can see what a
node does not serve; a wrong tensor is found by re-execution and judged by a drawn jury
(a tensor dispute).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Final, Protocol

import torch

from gwtf.contracts.certificate_tree import PreparedHop, SignedReceipt, ranges_tree
from gwtf.contracts.encoding import (
    FORWARD,
    CertRef,
    Eip712Domain,
    HopReceipt,
    WorkerSpan,
    node_address_of,
    node_public_key,
    scheduled_units,
    sign_receipt,
)
from gwtf.contracts.keccak import keccak256
from gwtf.errors import ConfigError
from gwtf.node.receipts.wire import MAX_PAGE, ReceiptPage

log = logging.getLogger(__name__)

FORGE_COUNTERSIGNATURE: Final = "forge-countersignature"
PHANTOM_HOPS: Final = "phantom-hops"
INFLATE_UNITS: Final = "inflate-units"
SHIFT_SPAN: Final = "shift-span"
WITHHOLD_LEAF: Final = "withhold-leaf"
CLAIM_TWICE: Final = "claim-twice"
EQUIVOCATE: Final = "equivocate"
WRONG_TENSOR: Final = "wrong-tensor"
DATA_NODE_CHEATS: Final = (
    FORGE_COUNTERSIGNATURE, PHANTOM_HOPS, INFLATE_UNITS, SHIFT_SPAN, WITHHOLD_LEAF,
)  # fmt: skip
RELAY_CHEATS: Final = (CLAIM_TWICE, EQUIVOCATE, WRONG_TENSOR)
#: The relative error a ``wrong-tensor`` relay puts in each forward output: a hundred times
#: the CPU re-execution tolerance, far below what training would notice at once.
WRONG_TENSOR_SCALE: Final = 1e-3
#: A made-up key signs forged countersignatures: anyone's but the counterparty's.
_FORGER_KEY: Final = keccak256(b"gwtf forged countersignature")
#: How many hops a ``phantom-hops`` data node makes up per epoch.
PHANTOMS_PER_EPOCH: Final = 2


#: Chain ids of dev chains (eth-tester, anvil and hardhat, geth --dev): the only chains a
#: cheat runs on, so that no setting left on can make a real node cheat.
DEV_CHAIN_IDS: Final = frozenset({131277322940537, 31337, 1337})


def check_cheat(mode: str, role: str, chain_id: int | None = None) -> None:
    """A ``ConfigError`` unless ``mode`` is "" or a cheat of ``role`` ("data" or "relay") on a
    dev chain (``chain_id``, when known)."""
    if not mode:
        return
    if chain_id is not None and chain_id not in DEV_CHAIN_IDS:
        raise ConfigError(
            f"node.cheat={mode!r} runs only on a dev chain, not chain {chain_id}; remove it "
            "from the settings (and GWTF_NODE_CHEAT from the environment)"
        )
    allowed = DATA_NODE_CHEATS if role == "data" else RELAY_CHEATS
    if mode not in allowed:
        raise ConfigError(
            f"node.cheat={mode!r} is no cheat of a {role} node; use one of "
            f"{', '.join(allowed)}, or leave it empty (an honest node)"
        )


class Distort(Protocol):
    """What a cheating relay makes of each forward output it computed, before it sends it on
    (a new tensor of the same shape). Pure: does not block or raise."""

    def __call__(self, output: torch.Tensor, /) -> torch.Tensor: ...


@dataclass
class Cheat:
    """One node's cheat. The receipt layer calls the hook of its step; every hook but the
    cheat's own returns what it was given."""

    mode: str
    private_key: bytes = field(repr=False)
    domain: Eip712Domain
    units_per_hop: int
    #: Receipts made up by a relay's cheat, served after its honest ones: (epoch, which) -> list.
    extras: dict[tuple[int, int], list[SignedReceipt]] = field(
        default_factory=lambda: defaultdict(list)
    )

    def __post_init__(self) -> None:
        self.address = node_address_of(node_public_key(self.private_key))
        log.warning(
            "THIS NODE CHEATS ON PURPOSE (node.cheat=%s): for tests and the demo only; an "
            "auditor will find it and its stake can be slashed",
            self.mode,
        )

    # ------------------------------------------------------------ a data node's
    def certify(self, chosen: list[PreparedHop]) -> list[PreparedHop]:
        """What the data node certifies instead of the honest ``chosen`` (non-empty)."""
        if self.mode == FORGE_COUNTERSIGNATURE:
            first = chosen[0].entry
            forged_signature = sign_receipt(first.receipt, self.domain, _FORGER_KEY)
            forged = replace(first, counterparty_signature=forged_signature)
            return [PreparedHop.of(forged, self.domain), *chosen[1:]]
        if self.mode == PHANTOM_HOPS:
            return chosen + [self._phantom(chosen[0].entry, n) for n in range(PHANTOMS_PER_EPOCH)]
        return chosen

    def _phantom(self, model: SignedReceipt, n: int) -> PreparedHop:
        r = model.receipt
        made_up = replace(
            r,
            stage=1,
            direction=FORWARD,
            units=scheduled_units(FORWARD, self.units_per_hop),
            attempt=1000 + n,  # a hop key no honest attempt numbering reaches
            worker=self.address,
            counterparty=self.address,
            outputDigest=keccak256(b"phantom" + r.outputDigest + bytes([n])),
        )
        signature = sign_receipt(made_up, self.domain, self.private_key)
        return PreparedHop.of(SignedReceipt(made_up, signature, signature), self.domain)

    def certificate(
        self, cert: CertRef, spans: tuple[WorkerSpan, ...]
    ) -> tuple[CertRef, tuple[WorkerSpan, ...]]:
        """The certificate and spans the data node submits for its tree's honest ones (the
        spans still partition what it submits, or the ledger would refuse them)."""
        if self.mode == SHIFT_SPAN:
            return _shifted(cert, spans)
        if self.mode != INFLATE_UNITS:
            return cert, spans
        ceiling = 2 * cert.count * self.units_per_hop  # the most the ledger takes
        units = min(ceiling, cert.units + self.units_per_hop)
        inflated = (*spans[:-1], replace(spans[-1], unitsEnd=units))
        return replace(cert, units=units, rangesRoot=ranges_tree(inflated).root), inflated

    def certified_page(self, page: ReceiptPage) -> ReceiptPage:
        """A page of the certificate as the data node serves it to auditors."""
        if self.mode != WITHHOLD_LEAF or page.offset != 0 or not page.entries:
            return page
        return replace(page, entries=page.entries[1:], leaves=page.leaves[1:])

    # ------------------------------------------------------------ a relay's
    def signed(self, entry: SignedReceipt) -> SignedReceipt | None:
        """A second receipt of the hop of ``entry`` (complete: this relay computed it) signed
        as its worker, or None."""
        if self.mode != CLAIM_TWICE or self.extras[(entry.receipt.epoch, 0)]:
            return None
        second = self._second_version(entry)
        signature = sign_receipt(second, self.domain, self.private_key)
        twice = SignedReceipt(second, signature, entry.counterparty_signature)
        self.extras[(entry.receipt.epoch, 0)].append(twice)
        return twice

    def received(self, entry: SignedReceipt) -> None:
        """``entry`` was countersigned here: countersign a second version of it too."""
        if self.mode != EQUIVOCATE or self.extras[(entry.receipt.epoch, 1)]:
            return
        second = self._second_version(entry)
        counter = sign_receipt(second, self.domain, self.private_key)
        self.extras[(entry.receipt.epoch, 1)].append(
            SignedReceipt(second, entry.worker_signature, counter)
        )

    def served(self, epoch: int, which: int, page: ReceiptPage) -> ReceiptPage:
        """A page of this relay's receipts (``which``: signed 0, received 1) with the cheat's
        made-up ones after the honest ones."""
        extra: Sequence[SignedReceipt] = self.extras.get((epoch, which), [])
        if not extra:
            return page
        total = page.total + len(extra)
        at_end = page.offset + len(page.entries) >= page.total
        if not at_end or len(page.entries) + len(extra) > MAX_PAGE:
            return replace(page, total=total)  # the next page, from the honest end, has them
        return replace(page, total=total, entries=page.entries + tuple(extra))

    def distort(self) -> Distort | None:
        """What a ``wrong-tensor`` relay does to each forward output, or None."""
        if self.mode != WRONG_TENSOR:
            return None
        return lambda output: output * (1.0 + WRONG_TENSOR_SCALE)

    @staticmethod
    def _second_version(entry: SignedReceipt) -> HopReceipt:
        r = entry.receipt
        return replace(r, outputDigest=keccak256(b"second version" + r.outputDigest))


def _shifted(
    cert: CertRef, spans: tuple[WorkerSpan, ...]
) -> tuple[CertRef, tuple[WorkerSpan, ...]]:
    """The spans with the first one's last leaf moved into the second (unchanged unless there
    are two spans and the first has two leaves). Only the index moves: the leaf's units are
    not known here, so the first span also ends off its new last leaf."""
    if len(spans) < 2 or spans[0].lastIndex < 1:
        return cert, spans
    shifted = (replace(spans[0], lastIndex=spans[0].lastIndex - 1), *spans[1:])
    return replace(cert, rangesRoot=ranges_tree(shifted).root), shifted
