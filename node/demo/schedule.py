"""The demo's work, without a chain: a tiny pipeline schedule, countersigned receipts, audits.

Two pipeline stages of relays and one data node. Each microbatch takes one relay per stage
(chosen by a seeded ``random.Random``) and makes four hops: forward at stage 1 and 2, backward at
stage 2 and 1. The "tensors" are random bytes; a hop's output digest is the keccak of the bytes
the counterparty received, and the next hop's input digest is the same value, so the digest chain
of each microbatch is consistent. The worker signs each receipt (EIP-712), the counterparty
checks that signature and the digest of what it received, then countersigns; the data node
certifies every hop of the microbatches it completed.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from eth_account.signers.local import LocalAccount
from eth_utils.crypto import keccak

from contracts.certificate_tree import SignedReceipt
from contracts.encoding import (
    BACKWARD,
    FORWARD,
    Eip712Domain,
    HopReceipt,
    hop_key,
    recover_signer,
    scheduled_units,
    sign_receipt,
)
from gwtf.errors import ProtocolError

# Bytes of a synthetic activation/gradient: enough to make digests meaningful, small to stay fast.
TENSOR_BYTES = 64


@dataclass(frozen=True)
class Hop:
    """One stage's forward or backward of one microbatch, before it is signed."""

    iteration: int
    microbatch_id: int
    stage: int
    direction: int
    worker: str
    counterparty: str
    input_tensor: bytes
    output_tensor: bytes


def synthetic_schedule(
    rng: random.Random,
    relays_by_stage: Sequence[Sequence[str]],
    data_node: str,
    iterations: int,
    microbatches_per_iteration: int,
) -> list[Hop]:
    """Every hop of ``iterations`` x ``microbatches_per_iteration`` microbatches, in order."""
    if len(relays_by_stage) != 2 or not all(relays_by_stage):
        raise ProtocolError("the demo schedule needs exactly two stages with a relay each")
    hops: list[Hop] = []
    for iteration in range(iterations):
        for slot in range(microbatches_per_iteration):
            microbatch_id = iteration * microbatches_per_iteration + slot
            first, second = (rng.choice(list(relays)) for relays in relays_by_stage)
            batch, act, logits, grad_logits, grad_act, grad_in = (
                rng.randbytes(TENSOR_BYTES) for _ in range(6)
            )
            common = {"iteration": iteration, "microbatch_id": microbatch_id}
            hops += [
                Hop(**common, stage=1, direction=FORWARD, worker=first, counterparty=second,
                    input_tensor=batch, output_tensor=act),
                Hop(**common, stage=2, direction=FORWARD, worker=second, counterparty=data_node,
                    input_tensor=act, output_tensor=logits),
                Hop(**common, stage=2, direction=BACKWARD, worker=second, counterparty=first,
                    input_tensor=grad_logits, output_tensor=grad_act),
                Hop(**common, stage=1, direction=BACKWARD, worker=first, counterparty=data_node,
                    input_tensor=grad_act, output_tensor=grad_in),
            ]  # fmt: skip
    return hops


def countersigned_receipt(
    hop: Hop,
    run_id: int,
    epoch: int,
    data_node: str,
    units_per_hop: int,
    keys: Mapping[str, LocalAccount],
    domain: Eip712Domain,
    received_output: bytes,
) -> SignedReceipt:
    """The worker signs the hop's receipt; the counterparty checks it against what it received
    and countersigns. Raises ``ProtocolError`` when the check fails (no countersignature)."""
    worker, counterparty = keys[hop.worker], keys[hop.counterparty]
    receipt = HopReceipt(
        runId=run_id,
        epoch=epoch,
        dataNode=data_node,
        iteration=hop.iteration,
        microbatchId=hop.microbatch_id,
        stage=hop.stage,
        direction=hop.direction,
        attempt=0,
        worker=worker.address,
        counterparty=counterparty.address,
        inputDigest=keccak(hop.input_tensor),
        outputDigest=keccak(hop.output_tensor),
        units=scheduled_units(hop.direction, units_per_hop),
    )
    worker_signature = sign_receipt(receipt, domain, worker.key)
    if recover_signer(receipt, domain, worker_signature) != worker.address:
        raise ProtocolError(f"receipt of {hop.worker} is not signed by it; not countersigning")
    if keccak(received_output) != receipt.outputDigest:
        raise ProtocolError(
            f"output of {hop.worker} does not match what arrived; not countersigning"
        )
    return SignedReceipt(receipt, worker_signature, sign_receipt(receipt, domain, counterparty.key))


@dataclass(frozen=True)
class Signed:
    """One signature an auditor has seen: who made it, over which receipt."""

    signer: str
    receipt: HopReceipt
    signature: bytes


def signatures_seen(receipts: Sequence[SignedReceipt]) -> list[Signed]:
    """Every signature of ``receipts``: each receipt's worker's and its counterparty's."""
    seen: list[Signed] = []
    for entry in receipts:
        seen.append(Signed(entry.receipt.worker, entry.receipt, entry.worker_signature))
        seen.append(Signed(entry.receipt.counterparty, entry.receipt, entry.counterparty_signature))
    return seen


def find_equivocations(seen: Sequence[Signed], domain: Eip712Domain) -> list[tuple[Signed, Signed]]:
    """Pairs of signatures by one key over two different receipts of one hop: what an auditor
    looks for, since the key that signed both pays."""
    first: dict[tuple[str, bytes], Signed] = {}
    pairs: list[tuple[Signed, Signed]] = []
    for signed in seen:
        try:
            signer = recover_signer(signed.receipt, domain, signed.signature)
        except ProtocolError:
            continue  # malformed: nothing anyone can be held to
        if signer != signed.signer:
            continue  # not this signer's signature at all
        key = (signed.signer, hop_key(signed.receipt))
        earlier = first.setdefault(key, signed)
        if earlier.receipt != signed.receipt:
            pairs.append((earlier, signed))
    return pairs
