"""The Court's rules, each step with its window and the outcome of silence: juror deposits,
the parties' salts, the draw (in proportion to deposit, parties excluded, a minimum pool, both
beacon sources), commit-reveal votes, fees to coherent seats and burned penalties for the
others, appeals up to the final 31 seats."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from web3.logs import DISCARD

from gwtf.contracts import fraud_proofs
from gwtf.contracts.bindings import COURT_BLOCKHASH, ContractRevert, SuiteParams, deploy_suite
from gwtf.contracts.fraud_proofs import FraudProof
from tests.contracts import jury
from tests.contracts.conftest import TEST_PARAMS, Certified, Juried
from tests.contracts.jury import (
    DRAWING,
    REFUSED,
    RIGHT,
    RULED,
    SALTS,
    VOTING,
    WRONG,
    Juror,
    honest,
    mine_to,
)
from tests.contracts.test_tensor_disputes import BOND, dispute_of, state_of
from tests.contracts.world import ETH, World, proof_reverts, reverts

REJECTED, UPHELD, NO_JURY = 3, 2, 4


def credit(w: World, account: str) -> int:
    return int(w.call(w.disputes.functions.creditWei(account)))


def fees(w: World, r: int = 0) -> int:
    return jury.fee(w) * int(w.call(w.court.functions.sizeOf(r)))


# ---------------------------------------------------------------- jurors


def test_only_an_active_nodes_wallet_deposits_and_a_locked_deposit_stays(juried: Juried) -> None:
    c, w = juried, juried.w
    juror = c.jurors[0]
    court = w.court.functions
    reverts(w, court.deposit(juror.node), w.stranger, "NotNodeWallet", juror.node, w.stranger)
    reverts(w, court.deposit(juror.node), juror.wallet, "ZeroAmount")
    w.tx(w.registry.functions.requestUnstake(c.c.address), w.wallet(2))
    reverts(w, court.deposit(c.c.address), w.wallet(2), "NodeNotActive", c.c.address)
    reverts(
        w, court.withdrawDeposit(juror.node, 1), w.stranger, "NotNodeWallet", juror.node, w.stranger
    )
    reverts(w, court.withdrawDeposit(juror.node, 0), juror.wallet, "ZeroAmount")
    # Seats lock a penalty each until the case is ruled.
    proof = dispute_of(c, c.a)
    _, case_id = jury.open_case(w, proof)
    jury.reveal_salt(w, case_id, proof)
    seats = Counter(jury.draw(w, case_id))
    sitting = next(j for j in c.jurors if j.node in seats)
    free = jury.JUROR_DEPOSIT - seats[sitting.node] * jury.penalty(w)
    reverts(
        w, court.withdrawDeposit(sitting.node, free + 1), sitting.wallet, "DepositLocked",
        sitting.node, free,
    )  # fmt: skip
    before = w.balance(sitting.wallet)
    receipt = w.tx(court.withdrawDeposit(sitting.node, free), sitting.wallet)
    gas = receipt["gasUsed"] * receipt["effectiveGasPrice"]
    assert w.balance(sitting.wallet) == before + free - gas
    assert jury.deposit_of(w, sitting.node) == seats[sitting.node] * jury.penalty(w)


def test_the_draw_follows_deposits_and_never_seats_a_party(juried: Juried) -> None:
    """The accused's wallet, the challenger and the sponsor each hold a juror node with far
    more deposit than everyone else; across many seats none of theirs is drawn (their weight
    is taken out of the draw, not retried), and the honest jurors' seats follow their free
    deposits (one holds 5x the others')."""
    c, w = juried, juried.w
    parties = (("a's", w.wallet(0)), ("sponsor's", w.sponsor), ("challenger's", w.challenger))
    for label, wallet in parties:
        key = w.register(f"{label} juror", wallet, ETH)
        w.tx(w.court.functions.deposit(key.address), wallet, 5 * ETH)
    heavy = c.jurors[0]
    w.tx(w.court.functions.deposit(heavy.node), heavy.wallet, 4 * jury.JUROR_DEPOSIT)
    drawn: Counter[str] = Counter()
    for proof in every_dispute_of_a(c):
        _, case_id = jury.open_case(w, proof)
        jury.reveal_salt(w, case_id, proof)
        drawn.update(jury.draw(w, case_id))
    assert set(drawn) <= {j.node for j in c.jurors}
    assert sum(drawn.values()) == 24
    # 5 of 12 deposit shares: 10 of the 24 seats expected; fewer than 2 has odds of 4e-5.
    assert drawn[heavy.node] >= 2
    # A second juror node of one wallet would let a wallet dodge exclusion: refused, even
    # once the first holds nothing (a party that moved its juror between the arming of a
    # draw and the draw would change which weight is taken out).
    key = w.register("a's second juror", w.wallet(0), ETH)
    first = w.call(w.court.functions.jurorOf(w.wallet(0)))
    reverts(
        w, w.court.functions.deposit(key.address), w.wallet(0), "OneJurorPerWallet",
        w.wallet(0), first, value=ETH,
    )  # fmt: skip
    w.tx(w.court.functions.withdrawDeposit(first, 5 * ETH), w.wallet(0))
    reverts(
        w, w.court.functions.deposit(key.address), w.wallet(0), "OneJurorPerWallet",
        w.wallet(0), first, value=ETH,
    )  # fmt: skip
    assert w.call(w.court.functions.jurorOf(w.wallet(0))) == first


def every_dispute_of_a(c: Certified) -> list[FraudProof]:
    """A tensor dispute of each of a's eight hops in the certificate (forwards and backwards)."""
    return [
        fraud_proofs.wrong_tensor(c.cert, c.tree.leaf_proof(index), entry)
        for index, entry in enumerate(c.tree.entries)
        if entry.receipt.worker == c.a.address
    ]


def test_a_pool_below_the_minimum_waits_then_draws_once_it_fills(certified: Certified) -> None:
    """Six jurors: the draw reverts PoolTooSmall and the case waits; a seventh joins and the
    same round is drawn."""
    c, w = certified, certified.w
    jurors = jury.seat_jurors(w, 6)
    proof = dispute_of(c, c.a)
    _, case_id = jury.open_case(w, proof)
    jury.reveal_salt(w, case_id, proof)
    seed = int(jury.rounds(w, case_id)[0][0])
    mine_to(w, seed + 1)
    reverts(w, w.court.functions.draw(case_id), w.stranger, "PoolTooSmall", 6, 7)
    wallet = jury.juror_wallet(w, "late")
    late = w.register("late juror", wallet, ETH)
    w.tx(w.court.functions.deposit(late.address), wallet, jury.JUROR_DEPOSIT)
    jurors.append(Juror(late, wallet))
    seats = jury.draw(w, case_id)  # the prevrandao window passed: re-armed, then drawn
    assert set(seats) <= {j.node for j in jurors}


def test_a_case_no_jury_could_sit_is_refused_and_everything_returns(certified: Certified) -> None:
    """At stake: the challenger's 0.1 ETH bond and 0.003 ETH of fees. With no pool the case
    cannot be drawn; once its patience is over anyone ends it REFUSED: the bond and the fees
    go back to the challenger and nobody is convicted. While the challenger may reopen it,
    a's stake stays frozen, its claims of the epoch wait and relays keep the epoch's evidence
    (reopenableUntil); then a claims its pay and anyone thaws its stake."""
    c, w = certified, certified.w
    proof = dispute_of(c, c.a)
    dispute_id, case_id = jury.open_case(w, proof)
    jury.reveal_salt(w, case_id, proof)
    (round0,) = jury.rounds(w, case_id)
    draw_by = int(round0[1])
    reverts(w, w.court.functions.executeRuling(case_id), w.stranger, "NotYet", case_id, draw_by + 1)
    mine_to(w, draw_by + 1)
    reverts(
        w, w.court.functions.draw(case_id), w.stranger, "OutsideWindow", case_id,
        int(round0[0]) + 1, draw_by,
    )  # fmt: skip
    receipt = w.tx(w.court.functions.executeRuling(case_id), w.stranger)
    (ruled,) = w.disputes.events.TensorDisputeRuled().process_receipt(receipt, errors=DISCARD)
    assert ruled["args"]["ruling"] == REFUSED and state_of(w, dispute_id) == NO_JURY
    assert credit(w, w.challenger) == BOND and jury.credit(w, w.challenger) == fees(w)
    claims_frozen = w.disputes.functions.claimsFrozen(c.run, 0, c.a.address)
    assert w.status_of(c.a) == 1 and w.call(claims_frozen)
    reverts(w, w.court.functions.executeRuling(case_id), w.stranger, "WrongPhase", case_id, RULED)
    # a's stake and claims wait while the challenger may reopen the dispute, then thaw.
    frozen = w.registry.functions.frozenCount(c.a.address)
    assert int(w.call(frozen)) == 1
    reopen_until = int(w.call(w.disputes.functions.reopenUntil(dispute_id)))
    assert reopen_until >= w.epoch_times(c.run, 0)[3]  # past the epoch's settlement
    assert int(w.call(w.disputes.functions.reopenableUntil(c.run, 0))) == reopen_until
    release = w.disputes.functions.releaseAfterGrace(dispute_id)
    reverts(w, release, w.stranger, "NotReopenable", dispute_id)
    w.travel_to(reopen_until)  # settled, still reopenable
    reverts(w, w.claim_fn(c.cert, c.tree, c.a), w.wallet(0), "ClaimFrozen", c.a.address)
    w.travel_to(reopen_until + 1)
    w.claim(c.cert, c.tree, c.a, w.wallet(0))  # the hold ends by itself
    assert not w.call(claims_frozen)
    w.tx(release, w.stranger)
    assert int(w.call(frozen)) == 0
    reverts(w, release, w.stranger, "NotReopenable", dispute_id)
    proof_reverts(w, proof, "DisputeExists", dispute_id)


def test_a_refused_dispute_is_reopened_by_its_challenger_after_the_epoch_settled(
    certified: Certified,
) -> None:
    """The attack fails: a cheater whose dispute lapsed for want of a jury would keep its
    stake and its pay, since the ruling comes after the epoch settled and the challenger's
    dispute on the receipt exists. At stake: the run's 1 ETH minimum of a's 2 ETH and a's pay
    of the epoch. a cannot claim in the grace; the challenger reopens the dispute within it,
    after settlement; once jurors have joined, the reopened dispute is drawn, upheld, ranks by
    its first commitment, and a's pay of the epoch is refused."""
    c, w = certified, certified.w
    proof = dispute_of(c, c.a)
    dispute_id, case_id = jury.open_case(w, proof)
    jury.reveal_salt(w, case_id, proof)
    mine_to(w, int(jury.rounds(w, case_id)[0][1]) + 1)
    w.tx(w.court.functions.executeRuling(case_id), w.stranger)
    assert state_of(w, dispute_id) == NO_JURY
    w.travel_to(w.epoch_times(c.run, 0)[3])  # the epoch has settled
    reverts(w, w.claim_fn(c.cert, c.tree, c.a), w.wallet(0), "ClaimFrozen", c.a.address)
    jurors = jury.seat_jurors(w)
    reopened, second = jury.open_case(w, proof)
    assert reopened != dispute_id and bool(w.call(w.disputes.functions.isReopening(reopened)))
    assert int(w.call(w.disputes.functions.reopenUntil(dispute_id))) == 0
    assert int(w.call(w.registry.functions.frozenCount(c.a.address))) == 1  # one freeze, kept
    jury.reveal_salt(w, second, proof)
    jury.draw(w, second)
    jury.vote(w, second, jurors, honest(WRONG))
    jury.execute(w, second)
    assert state_of(w, reopened) == UPHELD and w.stake_of(c.a) == ETH
    assert int(w.call(w.registry.functions.frozenCount(c.a.address))) == 0
    first_order = int(w.call(w.disputes.functions.tensorDisputes(dispute_id))[4])
    assert int(w.call(w.disputes.functions.tensorDisputes(reopened))[4]) == first_order
    w.travel_to(int(w.call(w.disputes.functions.reopenableUntil(c.run, 0))) + 1)
    reverts(w, w.claim_fn(c.cert, c.tree, c.a), w.wallet(0), "ClaimantConvicted", c.run, 0,
            c.a.address)  # fmt: skip


# ---------------------------------------------------------------- the parties' salts


def test_the_salt_steps_and_their_windows(juried: Juried) -> None:
    """The accused answers (node or wallet) within its window, once; the challenger reveals
    the salt it committed, after the answer, within its window; nobody else."""
    c, w = juried, juried.w
    proof = dispute_of(c, c.a)
    _, case_id = jury.open_case(w, proof)
    opened_at = int(jury.case(w, case_id)[2])
    phase = jury.phase_blocks(w)
    court = w.court.functions
    salt = jury.draw_salt(w, proof)
    # Before the accused answered and its window is over, the challenger's salt would tell
    # it how to steer the draw: refused.
    reverts(
        w, court.revealSalt(case_id, salt), w.challenger, "OutsideWindow", case_id,
        opened_at + phase + 1, opened_at + 2 * phase,
    )  # fmt: skip
    reverts(w, court.answer(case_id, b"\x01" * 32), w.stranger, "NotParty", case_id, w.stranger)
    jury.answer(w, case_id, w.wallet(0))
    reverts(
        w, court.answer(case_id, b"\x02" * 32), w.wallet(0), "OutsideWindow", case_id,
        opened_at, opened_at + phase,
    )  # fmt: skip
    reverts(w, court.revealSalt(case_id, salt), w.stranger, "NotParty", case_id, w.stranger)
    reverts(w, court.revealSalt(case_id, b"\x03" * 32), w.challenger, "WrongSalt", case_id)
    w.tx(court.revealSalt(case_id, salt), w.challenger)  # at once: the accused has answered
    assert jury.phase(w, case_id) == DRAWING
    reverts(w, court.revealSalt(case_id, salt), w.challenger, "WrongPhase", case_id, DRAWING)
    seed = int(jury.rounds(w, case_id)[0][0])
    reverts(w, court.draw(case_id), w.stranger, "NotYet", case_id, seed + 1)


def test_a_challenger_that_never_reveals_its_salt_loses(juried: Juried) -> None:
    """At stake: the challenger's 0.1 ETH bond. It does not reveal its draw salt: after the
    window anyone ends the case RIGHT, the bond goes to a's wallet, the unused fees back."""
    c, w = juried, juried.w
    dispute_id, case_id = jury.open_case(w, dispute_of(c, c.a))
    opened_at = int(jury.case(w, case_id)[2])
    end = opened_at + 2 * jury.phase_blocks(w)
    reverts(w, w.court.functions.executeRuling(case_id), w.stranger, "NotYet", case_id, end + 1)
    mine_to(w, end + 1)
    reverts(
        w, w.court.functions.revealSalt(case_id, jury.draw_salt(w, dispute_of(c, c.a))),
        w.challenger, "OutsideWindow", case_id, opened_at + jury.phase_blocks(w) + 1, end,
    )  # fmt: skip
    assert jury.phase(w, case_id) == SALTS
    jury.execute(w, case_id)
    assert state_of(w, dispute_id) == REJECTED
    assert credit(w, w.wallet(0)) == BOND and credit(w, w.challenger) == 0
    assert jury.credit(w, w.challenger) == fees(w)


# ---------------------------------------------------------------- votes, fees and penalties


def test_coherent_seats_are_paid_and_absent_or_incoherent_ones_fined(juried: Juried) -> None:
    """One seat votes with the majority, one against, one stays silent (the draw is redone
    until three jurors sit): the coherent juror earns a fee, the two others forfeit 20 fees
    each, and every unpaid fee and penalty is burned."""
    c, w = juried, juried.w
    for proof in every_dispute_of_a(c):  # 2 in 3 draws seat three jurors
        _, case_id = jury.open_case(w, proof)
        jury.reveal_salt(w, case_id, proof)
        seats = jury.draw(w, case_id)
        if len(set(seats)) == 3:
            break
    coherent, incoherent, absent = (next(j for j in c.jurors if j.node == s) for s in seats)
    court = w.court.functions
    # Votes outside their windows, of non-jurors, or that do not open their seal are refused.
    drawn_at = int(jury.rounds(w, case_id)[0][2])
    phase = jury.phase_blocks(w)
    outsider = next(j for j in c.jurors if j.node not in seats)
    reverts(
        w,
        court.commitVote(case_id, outsider.node, b"\x01" * 32),
        outsider.wallet,
        "NotJuror",
        case_id,
        outsider.node,
    )
    reverts(
        w,
        court.commitVote(case_id, coherent.node, b"\x01" * 32),
        w.stranger,
        "NotNodeWallet",
        coherent.node,
        w.stranger,
    )
    reverts(
        w, court.revealVote(case_id, coherent.node, WRONG, b"\x00" * 32), coherent.wallet,
        "OutsideWindow", case_id, drawn_at + phase + 1, drawn_at + 2 * phase,
    )  # fmt: skip
    reverts(
        w, court.appeal(case_id), w.stranger, "OutsideWindow", case_id, drawn_at + 2 * phase + 1,
        drawn_at + 3 * phase,
    )  # fmt: skip
    salt = b"\x05" * 32
    sealed = w.call(court.voteCommitment(case_id, 0, coherent.node, WRONG, salt))
    w.tx(court.commitVote(case_id, coherent.node, sealed), coherent.wallet)
    reverts(
        w,
        court.commitVote(case_id, coherent.node, sealed),
        coherent.wallet,
        "AlreadyCommitted",
        case_id,
        coherent.node,
    )
    other = w.call(court.voteCommitment(case_id, 0, incoherent.node, RIGHT, salt))
    w.tx(court.commitVote(case_id, incoherent.node, other), incoherent.wallet)
    mine_to(w, drawn_at + phase + 1)
    reverts(
        w, court.commitVote(case_id, absent.node, sealed), absent.wallet, "OutsideWindow",
        case_id, drawn_at + 1, drawn_at + phase,
    )  # fmt: skip
    reverts(
        w,
        court.revealVote(case_id, coherent.node, RIGHT, salt),
        coherent.wallet,
        "BadVote",
        case_id,
        coherent.node,
    )
    w.tx(court.revealVote(case_id, coherent.node, WRONG, salt), coherent.wallet)
    reverts(
        w,
        court.revealVote(case_id, coherent.node, WRONG, salt),
        coherent.wallet,
        "BadVote",
        case_id,
        coherent.node,
    )
    w.tx(court.revealVote(case_id, incoherent.node, RIGHT, salt), incoherent.wallet)
    # One each way: a tie is RIGHT (the accuser carries the burden). The challenger appeals
    # and the larger jury, all voting, finds the tensor WRONG.
    reverts(
        w, court.executeRuling(case_id), w.stranger, "NotYet", case_id, drawn_at + 3 * phase + 1
    )
    jury.appeal(w, case_id, w.challenger)
    seats_1 = jury.draw(w, case_id)
    assert len(seats_1) == 7
    jury.vote(w, case_id, c.jurors, honest(WRONG))
    burned = int(w.call(court.burnedWei()))
    deposits = {j.node: jury.deposit_of(w, j.node) for j in c.jurors}
    receipt = jury.execute(w, case_id)
    settled = jury.settled(w, receipt)
    fee, penalty = jury.fee(w), jury.penalty(w)
    assert settled[(0, coherent.node)] == (True, fee)
    assert settled[(0, incoherent.node)] == (False, penalty)
    assert settled[(0, absent.node)] == (False, penalty)
    for node, count in Counter(seats_1).items():
        assert settled[(1, node)] == (True, count * fee)
    assert int(w.call(court.burnedWei())) == burned + 2 * (penalty + fee)
    for juror in (incoherent, absent):
        assert jury.deposit_of(w, juror.node) == deposits[juror.node] - penalty
    paid = fee * (1 + len(seats_1))
    assert sum(jury.credit(w, j.wallet) for j in c.jurors) == paid
    assert w.stake_of(c.a) == ETH  # convicted by the appeal: the run's 1 ETH minimum taken
    before = w.balance(coherent.wallet)
    receipt = w.tx(court.withdrawCredit(), coherent.wallet)
    gas = receipt["gasUsed"] * receipt["effectiveGasPrice"]
    owed = fee * (1 + seats_1.count(coherent.node))
    assert w.balance(coherent.wallet) == before + owed - gas
    reverts(w, court.withdrawCredit(), coherent.wallet, "NothingToWithdraw", coherent.wallet)


def test_a_silent_jury_rules_right_and_every_seat_is_fined(juried: Juried) -> None:
    c, w = juried, juried.w
    dispute_id, _, receipt = jury.whole_case(w, dispute_of(c, c.a), c.jurors, lambda _: None)
    assert state_of(w, dispute_id) == REJECTED
    assert all(not coherent for coherent, _ in jury.settled(w, receipt).values())
    assert sum(jury.credit(w, j.wallet) for j in c.jurors) == 0


def test_an_appeal_runs_to_the_final_31_seats(certified: Certified) -> None:
    """Rounds of 3, 7, 15 and 31 seats alternate their rulings; the last one (WRONG) stands,
    the final round has no appeal, and only the seats that voted WRONG are paid."""
    c, w = certified, certified.w
    jurors = jury.seat_jurors(w, 8, deposit_wei=ETH)  # 56 seats lock 1.12 ETH in all
    proof = dispute_of(c, c.a)
    _, case_id = jury.open_case(w, proof)
    jury.reveal_salt(w, case_id, proof)
    sizes = []
    for r, truth in enumerate((RIGHT, WRONG, RIGHT, WRONG)):
        if r:
            jury.appeal(w, case_id, w.wallet(0) if truth == RIGHT else w.challenger)
        sizes.append(len(jury.draw(w, case_id)))
        jury.vote(w, case_id, jurors, honest(truth))
    assert sizes == [3, 7, 15, 31]
    drawn_at = int(jury.rounds(w, case_id)[3][2])
    mine_to(w, drawn_at + 2 * jury.phase_blocks(w) + 1)
    reverts(w, w.court.functions.appeal(case_id), w.stranger, "NoAppeal", case_id)
    receipt = w.tx(w.court.functions.executeRuling(case_id), w.stranger)
    settled = jury.settled(w, receipt)
    assert {r for (r, _), (coherent, _) in settled.items() if coherent} == {1, 3}
    assert w.stake_of(c.a) == ETH


def test_an_appeal_that_finds_no_jury_leaves_the_ruling_before_it(juried: Juried) -> None:
    """At stake: the appeal funder's 0.007 ETH of fees. Its round is never drawn: the first
    ruling (RIGHT) stands and the fees go back to the funder."""
    c, w = juried, juried.w
    proof = dispute_of(c, c.a)
    _, case_id = jury.open_case(w, proof)
    jury.reveal_salt(w, case_id, proof)
    jury.draw(w, case_id)
    jury.vote(w, case_id, c.jurors, honest(RIGHT))
    drawn_at = int(jury.rounds(w, case_id)[0][2])
    mine_to(w, drawn_at + 2 * jury.phase_blocks(w) + 1)
    reverts(w, w.court.functions.appeal(case_id), w.challenger, "WrongFee", 0, fees(w, 1))
    w.tx(w.court.functions.appeal(case_id), w.challenger, fees(w, 1))
    assert jury.phase(w, case_id) == DRAWING
    mine_to(w, int(jury.rounds(w, case_id)[1][1]) + 1)
    receipt = w.tx(w.court.functions.executeRuling(case_id), w.stranger)
    (ruled,) = w.court.events.CaseRuled().process_receipt(receipt, errors=DISCARD)
    assert ruled["args"]["ruling"] == RIGHT
    assert jury.credit(w, w.challenger) == fees(w, 1)
    assert w.status_of(c.a) == 1


# ---------------------------------------------------------------- the draw's beacon


def certified_on_a_suite_of_its_own(world: World, params: SuiteParams) -> Certified:
    """A suite deployed with ``params`` on the session's chain, with a run whose data node
    certified two microbatches through a (stage 1) and b (stage 2) in epoch 0."""
    suite = deploy_suite(world.w3, world.deployer, params)
    w = World(tester=world.tester, w3=world.w3, suite=suite, params=params)
    data = w.register("data", w.sponsor, 2 * ETH)
    a = w.register("a", w.wallet(0), 2 * ETH)
    b = w.register("b", w.wallet(1), 2 * ETH)
    run = w.open_run()
    w.add_data_node(run, data)
    w.join(run, a, w.wallet(0))
    w.join(run, b, w.wallet(1))
    tree = w.certificate_tree(w.pipeline_hops(run, 0, data, [a, b], range(2)))
    cert = w.certify(tree, run, 0, data)
    return Certified(w, run, data, a, b, b, tree, cert)


def test_a_pool_drained_by_the_seats_it_fills_cannot_draw_the_appeal(world: World) -> None:
    """Four jurors with two penalties of deposit each, on a court whose minimum pool is 3:
    the first round's three seats leave five seats' worth, so the seven-seat appeal runs dry
    and its draw reverts; a top-up lets the same round be drawn."""
    c = certified_on_a_suite_of_its_own(world, replace(TEST_PARAMS, court_min_pool=3))
    w = c.w
    jurors = jury.seat_jurors(w, 4, deposit_wei=2 * jury.penalty(w))
    proof = dispute_of(c, c.a)
    _, case_id = jury.open_case(w, proof)
    jury.reveal_salt(w, case_id, proof)
    jury.draw(w, case_id)
    jury.vote(w, case_id, jurors, honest(RIGHT))
    jury.appeal(w, case_id, w.challenger)
    mine_to(w, int(jury.rounds(w, case_id)[1][0]) + 1)
    try:
        w.tx(w.court.functions.draw(case_id), w.stranger)
        raise AssertionError("seven seats from five seats' worth of deposit must not be drawn")
    except ContractRevert as error:
        assert error.name == "JuryNotDrawable" and error.args[0] == case_id
        assert 5 <= error.args[1] < 7  # the seat at which the pool ran dry
    for juror in jurors:
        w.tx(w.court.functions.deposit(juror.node), juror.wallet, 2 * jury.penalty(w))
    assert len(jury.draw(w, case_id)) == 7


def test_a_blockhash_court_draws_from_the_seed_blocks_hash_and_rearms_after_256(
    world: World,
) -> None:
    """The other beacon source, on a suite of its own: a whole case on blockhash, and a seed
    block whose hash fell out of the 256 readable ones re-arms the draw."""
    # Windows long enough that a round waits past 256 blocks before it ends undrawn.
    params = replace(TEST_PARAMS, court_source=COURT_BLOCKHASH, court_phase_blocks=70)
    c = certified_on_a_suite_of_its_own(world, params)
    w, a = c.w, c.a
    assert int(w.call(w.court.functions.source())) == COURT_BLOCKHASH
    jurors = jury.seat_jurors(w, 7)
    proof = dispute_of(c, a)
    _, case_id = jury.open_case(w, proof)
    jury.reveal_salt(w, case_id, proof)
    seed = int(jury.rounds(w, case_id)[0][0])
    mine_to(w, seed + 257)
    receipt = w.tx(w.court.functions.draw(case_id), w.stranger)
    (rearmed,) = w.court.events.DrawRearmed().process_receipt(receipt, errors=DISCARD)
    assert rearmed["args"]["seedBlock"] > seed + 256
    jury.draw(w, case_id)
    jury.vote(w, case_id, jurors, honest(WRONG))
    jury.execute(w, case_id)
    assert w.stake_of(a) == ETH


def test_only_the_disputes_contract_opens_cases(world: World) -> None:
    w = world
    parties = (w.stranger, w.stranger, w.stranger, w.stranger, b"\x00" * 32)
    cost = int(w.call(w.court.functions.arbitrationCost()))
    fn = w.court.functions.createDispute(parties)
    reverts(w, fn, w.stranger, "NotArbitrable", w.stranger, value=cost)
    assert cost == 3 * TEST_PARAMS.court_fee_wei


def test_a_case_that_is_not_voting_takes_no_vote(juried: Juried) -> None:
    c, w = juried, juried.w
    proof = dispute_of(c, c.a)
    _, case_id = jury.open_case(w, proof)
    juror = c.jurors[0]
    reverts(
        w, w.court.functions.commitVote(case_id, juror.node, b"\x01" * 32), juror.wallet,
        "WrongPhase", case_id, SALTS,
    )  # fmt: skip
    jury.reveal_salt(w, case_id, proof)
    assert jury.phase(w, case_id) == DRAWING
    jury.draw(w, case_id)
    assert jury.phase(w, case_id) == VOTING


def test_a_partys_juror_does_not_count_for_the_pool(certified: Certified) -> None:
    """Six honest jurors and a's wallet's: the pool without the parties is six, below the
    minimum, so the case waits."""
    c, w = certified, certified.w
    jury.seat_jurors(w, 6)
    key = w.register("a's juror", w.wallet(0), ETH)
    w.tx(w.court.functions.deposit(key.address), w.wallet(0), ETH)
    assert int(w.call(w.court.functions.poolSize())) == 7
    proof = dispute_of(c, c.a)
    _, case_id = jury.open_case(w, proof)
    jury.reveal_salt(w, case_id, proof)
    mine_to(w, int(jury.rounds(w, case_id)[0][0]) + 1)
    reverts(w, w.court.functions.draw(case_id), w.stranger, "PoolTooSmall", 6, 7)


def test_a_juror_that_left_the_registry_never_sits_and_is_evicted_from_later_draws(
    juried: Juried,
) -> None:
    """A juror whose node unstaked cannot sit: a draw that hits it moves on to the seat's next
    point, so the draw goes on without asking anything of it. Anyone evicts it (its deposit
    stays its own), which takes it out of the pool of draws armed later."""
    c, w = juried, juried.w
    court = w.court.functions
    reverts(w, court.evict(c.jurors[0].node), w.stranger, "JurorActive", c.jurors[0].node)
    for juror in c.jurors[:5]:  # most of the pool: a draw is bound to hit one
        w.tx(w.registry.functions.requestUnstake(juror.node), juror.wallet)
    proof = dispute_of(c, c.a)
    _, case_id = jury.open_case(w, proof)
    jury.reveal_salt(w, case_id, proof)
    seats = jury.draw(w, case_id)
    assert set(seats) <= {j.node for j in c.jurors[5:]}
    for juror in c.jurors[:5]:
        w.tx(court.evict(juror.node), w.stranger)
    assert int(w.call(court.poolSize())) == 3
    reverts(w, court.evict(c.jurors[0].node), w.stranger, "JurorActive", c.jurors[0].node)
    assert jury.deposit_of(w, c.jurors[0].node) == jury.JUROR_DEPOSIT
    second = dispute_of(c, c.b)
    _, later = jury.open_case(w, second)
    jury.reveal_salt(w, later, second)
    mine_to(w, int(jury.rounds(w, later)[0][0]) + 1)
    reverts(w, court.draw(later), w.stranger, "PoolTooSmall", 3, 7)


def test_no_deposit_change_after_the_seed_is_armed_moves_a_seat(juried: Juried) -> None:
    """The draw grinding attack fails. A juror (1 of 9 equal deposits) whose other wallet
    disputes honest a (the run's 1 ETH minimum stake at risk) tries, on a local fork, top-ups
    of 1..24 wei of its deposit in the block of the draw, looking for one that hands it two of
    the three seats, and a fresh juror's deposit. The draw reads the weights as they stood when
    its seed block was armed, so every such variant seats exactly the jury of the untouched
    draw: nothing to grind. A seated juror that withdraws its whole deposit can no longer sit:
    its own seats move to their next points, and every other seat stays as drawn."""
    c, w = juried, juried.w
    wallet = jury.juror_wallet(w, "attacker")
    key = w.register("attacker juror", wallet, ETH)
    w.tx(w.court.functions.deposit(key.address), wallet, jury.JUROR_DEPOSIT)
    proof = dispute_of(c, c.a)
    _, case_id = jury.open_case(w, proof)
    jury.reveal_salt(w, case_id, proof)
    mine_to(w, int(jury.rounds(w, case_id)[0][0]) + 1)
    newcomer = jury.juror_wallet(w, "newcomer")
    newcomer_key = w.register("newcomer juror", newcomer, ETH)

    def seats_after(change: object) -> list[str]:
        snap = w.tester.take_snapshot()
        try:
            if isinstance(change, int):  # the attacker's top-up, in wei
                w.tx(w.court.functions.deposit(key.address), wallet, change)
            elif change == "newcomer":
                fn = w.court.functions.deposit(newcomer_key.address)
                w.tx(fn, newcomer, 10 * jury.JUROR_DEPOSIT)
            elif change is not None:  # a seated juror withdraws all it deposited
                leaver = next(j for j in c.jurors if j.node == change)
                fn = w.court.functions.withdrawDeposit(leaver.node, jury.JUROR_DEPOSIT)
                w.tx(fn, leaver.wallet)
            return jury.draw(w, case_id)
        finally:
            w.tester.revert_to_snapshot(snap)

    fair = seats_after(None)
    variants = [*range(1, 25), "newcomer"]
    moved = [change for change in variants if seats_after(change) != fair]
    assert moved == [], f"these changes after the seed was armed moved seats: {moved}"
    # A seated honest juror leaves: only its own seats are drawn again, never onto it.
    leaver = next(j.node for j in c.jurors if j.node in fair)
    redrawn = seats_after(leaver)
    assert leaver not in redrawn
    for seat, node in enumerate(fair):
        if node != leaver:
            assert redrawn[seat] == node, f"seat {seat} moved from {node} to {redrawn[seat]}"
    # The fair draw stands as drawn for real, whatever the attacker then tops up.
    w.tx(w.court.functions.deposit(key.address), wallet, 1)
    assert jury.draw(w, case_id) == fair
