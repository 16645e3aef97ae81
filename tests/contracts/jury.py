"""Test vocabulary for the Court: juror nodes with wallets of their own, a tensor dispute's
case, and each step of it (answer, salt, draw, votes, appeal, ruling) mined through its window."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from eth_account import Account
from eth_utils.crypto import keccak
from web3.logs import DISCARD
from web3.types import TxReceipt

from gwtf.contracts import fraud_proofs
from gwtf.contracts.bindings import transact
from gwtf.contracts.fraud_proofs import FraudProof
from tests.contracts.world import ETH, NodeKey, World

#: Enough for a draw whose every seat needs all its tries.
DRAW_GAS = 10_000_000

RIGHT, WRONG, REFUSED = 1, 2, 0
SALTS, DRAWING, VOTING, RULED = 1, 2, 3, 4
JUROR_STAKE = ETH  # each juror node's registry stake
JUROR_DEPOSIT = ETH // 10  # each juror's court deposit: 5 penalties at the test fee
JURORS = 8


@dataclass(frozen=True)
class Juror:
    key: NodeKey
    wallet: str

    @property
    def node(self) -> str:
        return self.key.address


def juror_wallet(w: World, label: str) -> str:
    """A fresh wallet the chain unlocks, funded with 10 ETH by the deployer."""
    private_key = keccak(text=f"gwtf test juror wallet {label}")
    address = Account.from_key(private_key).address
    if address not in w.w3.eth.accounts:  # unlocked once per session, whatever the snapshot
        w.tester.add_account("0x" + private_key.hex())
    if w.balance(address) < 5 * ETH:
        w.w3.eth.send_transaction({"from": w.deployer, "to": address, "value": 10 * ETH})
    return address


def seat_jurors(w: World, count: int = JURORS, deposit_wei: int = JUROR_DEPOSIT) -> list[Juror]:
    """``count`` juror nodes, each registered from a wallet of its own and holding a deposit."""
    jurors = []
    for i in range(count):
        wallet = juror_wallet(w, str(i))
        key = w.register(f"juror {i}", wallet, JUROR_STAKE)
        w.tx(w.court.functions.deposit(key.address), wallet, deposit_wei)
        jurors.append(Juror(key, wallet))
    return jurors


def fee(w: World) -> int:
    return int(w.call(w.court.functions.feeWei()))


def penalty(w: World) -> int:
    return 20 * fee(w)


def phase_blocks(w: World) -> int:
    return int(w.call(w.court.functions.phaseBlocks()))


def mine_to(w: World, block: int) -> None:
    """Mines until the next transaction lands in ``block`` (or at once if it is past)."""
    gap = block - 1 - w.w3.eth.block_number
    if gap > 0:
        w.tester.mine_blocks(gap)


def case_of(w: World, receipt: TxReceipt) -> tuple[int, int]:
    """(dispute id, case id) of the tensor dispute ``receipt`` opened."""
    (event,) = w.disputes.events.TensorDisputeReferred().process_receipt(receipt, errors=DISCARD)
    return int(event["args"]["id"]), int(event["args"]["caseId"])


def open_case(w: World, proof: FraudProof, challenger: str | None = None) -> tuple[int, int]:
    return case_of(w, w.prove(proof, challenger))


def case(w: World, case_id: int) -> Any:
    return w.call(w.court.functions.getCase(case_id))


def phase(w: World, case_id: int) -> int:
    return int(case(w, case_id)[3])


def rounds(w: World, case_id: int) -> Any:
    return w.call(w.court.functions.getRounds(case_id))


def answer(w: World, case_id: int, sender: str, salt: bytes | None = None) -> TxReceipt:
    return w.tx(w.court.functions.answer(case_id, salt or os.urandom(32)), sender)


def draw_salt(w: World, proof: FraudProof, challenger: str | None = None) -> bytes:
    return w.draw_salts[(challenger or w.challenger, proof.proof_hash)]


def reveal_salt(
    w: World, case_id: int, proof: FraudProof, challenger: str | None = None
) -> TxReceipt:
    """The challenger's salt, once the answer window is over (or the accused answered)."""
    challenger = challenger or w.challenger
    opened_at = int(case(w, case_id)[2])
    if not case(w, case_id)[4]:
        mine_to(w, opened_at + phase_blocks(w) + 1)
    salt = draw_salt(w, proof, challenger)
    return w.tx(w.court.functions.revealSalt(case_id, salt), challenger)


def draw(w: World, case_id: int) -> list[str]:
    """Draws the current round once its seed block is past; returns its seats."""
    for _ in range(2):  # a beacon past its window re-arms once
        (*_, last) = rounds(w, case_id)
        mine_to(w, int(last[0]) + 1)
        # A draw's gas depends on its seed (each seat tries up to SEAT_TRIES points past jurors
        # who cannot sit): more than the world's fixed limit in unlucky seeds of a thin pool.
        receipt = transact(w.w3, w.court.functions.draw(case_id), w.stranger, gas=DRAW_GAS)
        drawn = w.court.events.JuryDrawn().process_receipt(receipt, errors=DISCARD)
        if drawn:
            return [str(seat) for seat in drawn[0]["args"]["seats"]]
    raise AssertionError(f"case {case_id} was re-armed twice")


def vote(
    w: World, case_id: int, jurors: list[Juror], choose: Callable[[Juror], int | None]
) -> None:
    """Each drawn juror of the current round commits ``choose(juror)`` (None: absent), then
    reveals it in the reveal window."""
    (*_, last) = rounds(w, case_id)
    r = len(rounds(w, case_id)) - 1
    drawn_at, seats = int(last[2]), {str(s) for s in last[8]}
    sitting = [j for j in jurors if j.node in seats]
    salts: dict[str, tuple[int, bytes]] = {}
    for juror in sitting:
        choice = choose(juror)
        if choice is None:
            continue
        salt = os.urandom(32)
        salts[juror.node] = (choice, salt)
        commitment = w.call(w.court.functions.voteCommitment(case_id, r, juror.node, choice, salt))
        w.tx(w.court.functions.commitVote(case_id, juror.node, commitment), juror.wallet)
    mine_to(w, drawn_at + phase_blocks(w) + 1)
    for juror in sitting:
        if juror.node in salts:
            choice, salt = salts[juror.node]
            fn = w.court.functions.revealVote(case_id, juror.node, choice, salt)
            w.tx(fn, juror.wallet)


def appeal(w: World, case_id: int, funder: str) -> TxReceipt:
    (*_, last) = rounds(w, case_id)
    r = len(rounds(w, case_id)) - 1
    mine_to(w, int(last[2]) + 2 * phase_blocks(w) + 1)
    fees = fee(w) * int(w.call(w.court.functions.sizeOf(r + 1)))
    return w.tx(w.court.functions.appeal(case_id), funder, fees)


def execute(w: World, case_id: int) -> TxReceipt:
    """Mines past the last window of the case and executes its ruling."""
    last = rounds(w, case_id)[-1]
    r = len(rounds(w, case_id)) - 1
    windows = 2 if r == 3 else 3
    if phase(w, case_id) == VOTING:
        mine_to(w, int(last[2]) + windows * phase_blocks(w) + 1)
    return w.tx(w.court.functions.executeRuling(case_id), w.stranger)


def settled(w: World, receipt: TxReceipt) -> Mapping[tuple[int, str], tuple[bool, int]]:
    """(round, node) -> (coherent, wei) of each seat settled, summed per juror and round."""
    found: dict[tuple[int, str], tuple[bool, int]] = {}
    for event in w.court.events.JurorSettled().process_receipt(receipt, errors=DISCARD):
        key = (int(event["args"]["round"]), str(event["args"]["node"]))
        _, wei = found.get(key, (True, 0))
        found[key] = (bool(event["args"]["coherent"]), wei + int(event["args"]["amountWei"]))
    return found


def honest(truth: int) -> Callable[[Juror], int]:
    return lambda _: truth


def whole_case(
    w: World, proof: FraudProof, jurors: list[Juror], choose: Callable[[Juror], int | None],
    challenger: str | None = None,
) -> tuple[int, int, TxReceipt]:  # fmt: skip
    """Opens a dispute, reveals the challenger's salt, draws, votes and executes one round."""
    dispute_id, case_id = open_case(w, proof, challenger)
    reveal_salt(w, case_id, proof, challenger)
    draw(w, case_id)
    vote(w, case_id, jurors, choose)
    return dispute_id, case_id, execute(w, case_id)


def credit(w: World, account: str) -> int:
    return int(w.call(w.court.functions.creditWei(account)))


def deposit_of(w: World, node: str) -> int:
    return int(w.call(w.court.functions.jurors(node))[1])


def draw_salt_hash(salt: bytes) -> bytes:
    return fraud_proofs.draw_salt_hash(salt)
