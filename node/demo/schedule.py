"""The demo's work, without a chain: a tiny pipeline schedule, countersigned receipts, audits.

Two pipeline stages of relays and one data node. Each microbatch takes one relay per stage
(chosen by a seeded ``random.Random``) and makes four hops: forward at stage 0 and 1, backward at
stage 1 and 0. The "tensors" are random bytes; a hop's output digest is the keccak of the bytes
the counterparty received, and the next hop's input digest is the same value, so the digest chain
of each microbatch is consistent. The worker signs each receipt (EIP-712), the counterparty
checks that signature and the digest of what it received, then countersigns.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from eth_account.signers.local import LocalAccount
from eth_utils.crypto import keccak

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
from contracts.epoch_tree import EpochTree, SignedReceipt
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
                Hop(**common, stage=0, direction=FORWARD, worker=first, counterparty=second,
                    input_tensor=batch, output_tensor=act),
                Hop(**common, stage=1, direction=FORWARD, worker=second, counterparty=data_node,
                    input_tensor=act, output_tensor=logits),
                Hop(**common, stage=1, direction=BACKWARD, worker=second, counterparty=first,
                    input_tensor=grad_logits, output_tensor=grad_act),
                Hop(**common, stage=0, direction=BACKWARD, worker=first, counterparty=data_node,
                    input_tensor=grad_act, output_tensor=grad_in),
            ]  # fmt: skip
    return hops


def countersigned_receipt(
    hop: Hop,
    run_id: int,
    epoch: int,
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
    return SignedReceipt(receipt, sign_receipt(receipt, domain, counterparty.key))


def receipts_by_worker(receipts: Sequence[SignedReceipt]) -> dict[str, list[SignedReceipt]]:
    """Each worker's receipts in schedule order (the order of its epoch tree's leaves)."""
    grouped: dict[str, list[SignedReceipt]] = defaultdict(list)
    for signed in receipts:
        grouped[signed.receipt.worker].append(signed)
    return dict(grouped)


def find_double_claims(tree: EpochTree) -> list[tuple[int, int]]:
    """Pairs of leaf indices of one tree that claim the same hop (what an auditor looks for)."""
    first_index: dict[bytes, int] = {}
    pairs: list[tuple[int, int]] = []
    for index, entry in enumerate(tree.entries):
        key = hop_key(entry.receipt)
        if key in first_index:
            pairs.append((first_index[key], index))
        else:
            first_index[key] = index
    return pairs
