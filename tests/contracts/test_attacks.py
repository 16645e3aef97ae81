"""The attacks a rational attacker with several wallets, a colluding peer and the mempool in
view would try on the ledger, one test each, written as "the attack fails": it costs the
attacker, it gains nothing, and no honest node loses anything. The numbering follows the table
of attack classes in gwtf/contracts/README.md."""

from __future__ import annotations

from dataclasses import replace

from eth_utils.crypto import keccak
from web3.logs import DISCARD

from gwtf.contracts import fraud_proofs
from gwtf.contracts.bindings import ContractRevert
from gwtf.contracts.encoding import (
    CertifiedHop,
    WorkerSpan,
    peer_id_of_public_key,
    sign_binding,
)
from gwtf.node.local_api.watcher import slashes_of
from tests.contracts import jury
from tests.contracts.conftest import TEST_PARAMS, Certified, Juried, Staffed
from tests.contracts.world import (
    EPOCH_S,
    ETH,
    HOP_PRICE,
    World,
    default_capacity,
    proof_reverts,
    reverts,
)

BOUNTY = TEST_PARAMS.bounty_bps / 10_000


def leaf(index: int, units_before: int, worker: str, units: int) -> CertifiedHop:
    """A hand-made certificate leaf (for dishonest trees)."""
    seed = f"{index} {worker}"
    return CertifiedHop(
        index, units_before, worker, units, keccak(text=f"key {seed}"),
        keccak(text=f"digest {seed}"), keccak(text=f"sigs {seed}"),
    )  # fmt: skip


def every_proof_against_the_honest_fails(w: World, c: Certified) -> None:
    """Every fraud proof an attacker can build from the public data of an honest epoch (the
    certificate tree, every receipt and signature behind it) reverts."""
    tree, cert = c.tree, c.cert
    for index in range(tree.count):
        entry = tree.entries[index]
        assert entry is not None
        leaf = tree.leaf_proof(index)
        proof_reverts(w, fraud_proofs.invalid_hop(cert, leaf, entry), "HopValid", index)
        proof_reverts(w, fraud_proofs.bad_totals(cert, leaf), "TotalsBacked", index)
        if index + 1 < tree.count:
            after = tree.leaf_proof(index + 1)
            proof = fraud_proofs.bad_sequence(cert, leaf, after)
            proof_reverts(w, proof, "SequenceConsistent", index, index + 1)
    for key in (c.data, c.a, c.b):
        assert w.status_of(key) == 1  # Active: nobody honest was slashed


# ------------------------------------------------------------ 1. copying published work


def test_1_copying_an_honest_nodes_published_receipts_slashes_nobody_and_earns_nothing(
    certified: Certified,
) -> None:
    w, run, a = certified.w, certified.run, certified.a
    copier = w.register("copier", w.attacker, 1 * ETH)
    w.join(run, copier, w.attacker)
    honest = next(e for e in certified.tree.entries if e and e.receipt.worker == a.address)
    # The copier claims a's hop as its own: a receipt naming itself, with a's real signatures.
    stolen = replace(honest.receipt, worker=copier.address)
    proof = fraud_proofs.equivocation(
        a.address, honest.receipt, honest.worker_signature, stolen, honest.worker_signature
    )
    proof_reverts(w, proof, "NotSameHop")  # a different worker is a different hop
    # The copy and the original under a's key: a never signed the copy.
    same_key = replace(honest.receipt, outputDigest=keccak(text="copied"))
    proof = fraud_proofs.equivocation(
        a.address, honest.receipt, honest.worker_signature, same_key, honest.worker_signature
    )
    try:
        w.prove(proof)
        raise AssertionError("a proof from one real signature and one copied must fail")
    except ContractRevert as error:
        assert error.name == "NotOneSigner"
    every_proof_against_the_honest_fails(w, certified)
    # The copier's leaf is in no certificate, so it has no range to claim.
    assert certified.tree.worker_range(copier.address) is None
    w.to_settled(run, 0)
    w.claim(certified.cert, certified.tree, a, w.wallet(0))
    assert w.stake_of(a) == 2 * ETH


# ------------------------------------------------------------ 2. an equivocating counterparty


def test_2_a_counterparty_that_countersigns_two_versions_pays_and_the_workers_do_not(
    certified: Certified,
) -> None:
    w, b = certified.w, certified.b
    entry = next(e for e in certified.tree.entries if e and e.receipt.counterparty == b.address)
    # b countersigns a second version of a's hop naming another worker, and another output.
    for change in ({"outputDigest": keccak(text="v2")}, {"iteration": 99}):
        version = replace(entry.receipt, **change)
        signature = w.signed(version, certified.c, b).counterparty_signature
        proof = fraud_proofs.equivocation(
            b.address, entry.receipt, entry.counterparty_signature, version, signature
        )
        if change.get("iteration"):
            proof_reverts(w, proof, "AlreadySlashed", b.address)
            continue
        w.prove(proof)
    assert w.stake_of(b) == 0
    assert w.stake_of(certified.a) == 2 * ETH and w.status_of(certified.a) == 1
    # b's bounty to its own second wallet would be 5 % of its 4 ETH: it lost 3.8 ETH net.
    w.award(b.address)
    assert w.call(w.disputes.functions.creditWei(w.challenger)) == int(4 * ETH * BOUNTY)


# ------------------------------------------------------------ 3. attempt numbers


def test_3_extra_attempts_earn_nothing_without_a_certificate(certified: Certified) -> None:
    w, run, a, data = certified.w, certified.run, certified.a, certified.data
    accomplice = w.register("accomplice", w.accomplice, 1 * ETH)
    w.join(run, accomplice, w.accomplice)
    # a re-signs its hop under attempts 1..3, countersigned by an accomplice: valid receipts
    # with their own keys, but the data node certified attempt 0 only.
    honest = next(e for e in certified.tree.entries if e and e.receipt.worker == a.address)
    extra = [
        w.signed(replace(honest.receipt, attempt=n, counterparty=accomplice.address), a, accomplice)
        for n in (1, 2, 3)
    ]
    inflated = w.certificate_tree([*certified.tree.entries, *extra])  # type: ignore[list-item]
    w.to_settled(run, 0)
    # A range built from the attacker's own tree is not in the data node's certificate.
    span = inflated.worker_range(a.address)
    assert span is not None
    fn = w.ledger.functions.claimReward(*span.claim_args(certified.cert))
    reverts(w, fn, w.wallet(0), "LeafNotInTree", data.address, span.first.hop.index)
    before = w.balance(w.wallet(0))
    receipt = w.claim(certified.cert, certified.tree, a, w.wallet(0))
    gas = receipt["gasUsed"] * receipt["effectiveGasPrice"]
    # Its certified hops at the run's price: 4 forwards and 4 backwards.
    assert w.balance(w.wallet(0)) - before + gas == 12 * HOP_PRICE


# ------------------------------------------------------------ 4. sybil countersigning


def test_4_made_up_hops_countersigned_by_a_sybil_take_nothing_from_the_budget(
    staffed: Staffed,
) -> None:
    w, run, a, data = staffed.w, staffed.run, staffed.a, staffed.data
    sybil = w.register("sybil", w.attacker, 1 * ETH)
    second = w.register("sybil-2", w.attacker, 1 * ETH)  # the same wallet's second node
    w.join(run, sybil, w.attacker)
    w.join(run, second, w.attacker)
    made_up = [
        w.signed(w.receipt(run, 0, data, sybil, second, 1_000 + m), sybil, second)
        for m in range(256)
    ]
    fabricated = w.certificate_tree(made_up)  # a tree of its own: no data node commits it
    honest = w.certificate_tree(w.pipeline_hops(run, 0, data, [a, staffed.b], range(2)))
    cert = w.certify(honest, run, 0, data)
    w.to_settled(run, 0)
    span = fabricated.worker_range(sybil.address)
    assert span is not None
    fn = w.ledger.functions.claimReward(*span.claim_args(cert))
    reverts(w, fn, w.attacker, "LeafNotInTree", data.address, 0)
    for key, wallet in ((a, w.wallet(0)), (staffed.b, w.wallet(1))):
        w.claim(cert, honest, key, wallet)
    book = w.call(w.ledger.functions.epochBook(run, 0))
    assert book[4] == book[0]  # all it reserved, to the honest


# ------------------------------------------------------------ 5. a countersigner gone


def test_5_a_countersigner_that_left_before_the_epoch_cannot_back_a_hop(world: World) -> None:
    w = world
    data = w.register("data", w.sponsor)
    a = w.register("a", w.wallet(0))
    leaver = w.register("leaver", w.wallet(1))
    run = w.open_run()
    w.add_data_node(run, data)
    w.join(run, a, w.wallet(0))
    w.join(run, leaver, w.wallet(1))
    w.tx(w.ledger.functions.leaveRun(run, leaver.address), w.wallet(1))
    reverts(
        w, w.ledger.functions.joinRun(run, leaver.address), w.wallet(1), "AlreadyLeft", run,
        leaver.address,
    )  # fmt: skip
    starts, _, _, _ = w.epoch_times(run, 1)
    w.travel_to(starts + 1)
    receipt = w.receipt(run, 1, data, a, leaver, 3)
    tree = w.certificate_tree([w.signed(receipt, a, leaver)])
    cert = w.certify(tree, run, 1, data)
    w.prove(fraud_proofs.invalid_hop(cert, tree.leaf_proof(0), tree.entries[0]))  # type: ignore[arg-type]
    assert w.stake_of(data) == 0  # the data node that certified it pays, not the worker
    assert w.stake_of(a) == 2 * ETH


# ------------------------------------------------------------ 6. unbounded claims


def test_6_a_claim_is_bounded_by_its_range_and_an_epoch_by_its_budget(staffed: Staffed) -> None:
    w, run, a, b, data = staffed.w, staffed.run, staffed.a, staffed.b, staffed.data
    low, high = sorted((a, b), key=lambda k: int(k.address, 16))
    # A dishonest tree: low's leaf claims to end at 10^7 units, over high's range (the fraud
    # nobody proves in time). The spans it is submitted with must partition its 300 units.
    hops = [
        leaf(0, 0, low.address, 100),
        leaf(1, 100, low.address, 10_000_000 - 100),
        leaf(2, 200, high.address, 100),
    ]
    tree = w.dishonest_tree(
        hops, [WorkerSpan(low.address, 1, 200), WorkerSpan(high.address, 2, 300)]
    )
    w.to_submission(run, 0)
    cert = w.cert_of(tree, run, 0, data.address, count=3, units=300)
    w.submit(cert)
    w.to_settled(run, 0)
    wallet_of = {a.address: w.wallet(0), b.address: w.wallet(1)}
    # low's leaves bound 0..10^7, not its span 0..200.
    reverts(
        w, w.claim_fn(cert, tree, low), wallet_of[low.address], "NotWorkersRange", low.address, 0, 1
    )
    w.claim(cert, tree, high, wallet_of[high.address])
    book = w.call(w.ledger.functions.epochBook(run, 0))
    assert book[4] <= book[0]  # never more than the certificate reserved


# ------------------------------------------------------------ 7. peer-id squatting


def test_7_nobody_can_bind_another_nodes_key_and_the_peer_id_follows_from_it(
    world: World,
) -> None:
    w = world
    victim = w.key("victim")
    # The squatter knows the victim's public key (it is public) but not its private key.
    forged = sign_binding(w.attacker, w.key("squatter").private_key, w.registry_domain)
    fn = w.registry.functions.registerNode(victim.public_key, default_capacity(), forged)
    try:
        w.tx(fn, w.attacker, ETH)
        raise AssertionError("a binding signed by another key must not register")
    except ContractRevert as error:
        assert error.name == "BadBindingSignature" and error.args[0] == victim.address
    # The victim's own binding, replayed by the squatter from another wallet, fails too.
    own = sign_binding(w.wallet(0), victim.private_key, w.registry_domain)
    fn = w.registry.functions.registerNode(victim.public_key, default_capacity(), own)
    try:
        w.tx(fn, w.attacker, ETH)
        raise AssertionError("a binding signed for another wallet must not register")
    except ContractRevert as error:
        assert error.name == "BadBindingSignature"
    receipt = w.tx(fn, w.wallet(0), ETH)
    (event,) = w.registry.events.NodeRegistered().process_receipt(receipt)
    assert event["args"]["node"] == victim.address
    peer_id = bytes(event["args"]["peerId"])
    assert peer_id == victim.peer_id == peer_id_of_public_key(victim.public_key)


# ------------------------------------------------------------ 8. the window race


def test_8_windows_equal_to_the_unbonding_delay_leave_no_second_to_escape(world: World) -> None:
    w = world
    delay = TEST_PARAMS.unbonding_delay_s
    window = delay - 2 * EPOCH_S  # 2 epochs + the window == the delay exactly
    reverts(
        w, w.ledger.functions.openRun(w.run_config(challengeWindowS=window + 1)), w.sponsor,
        "WindowsExceedUnbonding", delay + 1, delay,
    )  # fmt: skip
    data = w.register("data", w.sponsor)
    cheat = w.register("cheat", w.attacker)
    peer = w.register("peer", w.wallet(0))
    run = w.open_run(challengeWindowS=window)
    w.add_data_node(run, data)
    w.join(run, cheat, w.attacker)
    w.join(run, peer, w.wallet(0))
    # The cheat signs two versions of a hop in epoch 0 and unstakes at once.
    first = w.receipt(run, 0, data, cheat, peer, 1)
    second = replace(first, outputDigest=keccak(text="other"))
    one, two = w.signed(first, cheat, peer), w.signed(second, cheat, peer)
    w.tx(w.registry.functions.requestUnstake(cheat.address), w.attacker)
    unlock_at = w.call(w.registry.functions.unlockAt(cheat.address))
    _, _, _, settles_at = w.epoch_times(run, 0)
    assert unlock_at > settles_at  # unbonding began after the epoch started
    proof = fraud_proofs.equivocation(
        cheat.address, first, one.worker_signature, second, two.worker_signature
    )
    salt = w.commit(proof, w.challenger)
    snapshot = w.tester.take_snapshot()
    w.travel_to(settles_at - 1)  # the last second a proof is judged: the stake is locked
    reverts(
        w, w.registry.functions.withdrawStake(cheat.address), w.attacker, "StakeStillLocked",
        cheat.address, unlock_at, settles_at - 1,
    )  # fmt: skip
    w.tester.revert_to_snapshot(snapshot)
    w.travel_to(settles_at - 1)
    w.tx(w.reveal_fn(proof, salt), w.challenger)
    assert w.stake_of(cheat) == 0


# ------------------------------------------------------------ 9. copying from the mempool


def test_9_a_proof_copied_from_the_mempool_pays_the_copier_nothing(certified: Certified) -> None:
    w, a = certified.w, certified.a
    entry = next(e for e in certified.tree.entries if e and e.receipt.worker == a.address)
    other = replace(entry.receipt, outputDigest=keccak(text="v2"))
    proof = fraud_proofs.equivocation(
        a.address, entry.receipt, entry.worker_signature, other,
        w.signed(other, a, certified.b).worker_signature,
    )  # fmt: skip
    salt = w.commit(proof, w.challenger)
    # The copier sees the reveal's calldata: sending it from its own account has no commitment,
    # and a commitment made now can be revealed only in a later block.
    reverts(
        w, w.reveal_fn(proof, salt), w.attacker, "NoCommitment",
        fraud_proofs.commitment_of(w.attacker, salt, proof.proof_hash),
    )  # fmt: skip
    copier_salt = w.commit(proof, w.attacker)  # a block later than the original commitment
    w.tx(w.reveal_fn(proof, salt), w.challenger)  # the original lands first
    reverts(w, w.reveal_fn(proof, copier_salt), w.attacker, "AlreadySlashed", a.address)
    w.award(a.address)
    assert w.call(w.disputes.functions.creditWei(w.attacker)) == 0
    assert w.call(w.disputes.functions.creditWei(w.challenger)) == int(2 * ETH * BOUNTY)


# ------------------------------------------------------------ 10. reporting oneself


def test_10_a_cheater_reporting_itself_from_a_second_wallet_loses_most_of_its_stake(
    certified: Certified,
) -> None:
    w, b = certified.w, certified.b
    entry = next(e for e in certified.tree.entries if e and e.receipt.worker == b.address)
    other = replace(entry.receipt, outputDigest=keccak(text="self"))
    proof = fraud_proofs.equivocation(
        b.address, entry.receipt, entry.worker_signature, other,
        w.signed(other, b, certified.a).worker_signature,
    )  # fmt: skip
    w.prove(proof, w.accomplice)  # b's operator's second wallet
    w.award(b.address)
    back = w.call(w.disputes.functions.creditWei(w.accomplice))
    assert back == int(4 * ETH * BOUNTY)
    assert 4 * ETH - back == int(4 * ETH * (1 - BOUNTY))  # 3.8 ETH lost for good
    assert w.call(w.disputes.functions.burnedWei()) == 4 * ETH - back


def test_10_no_deployment_sets_a_bounty_that_could_pay(world: World) -> None:
    from gwtf.contracts.bindings import deploy_contract

    w = world
    for bps in (0, 1_001, 10_000):
        try:
            deploy_contract(
                w.w3,
                "Disputes",
                w.deployer,
                w.registry.address,
                w.ledger.address,
                w.court.address,
                bps,
                1,
                1,
            )
            raise AssertionError(f"a bounty of {bps} bps must be refused")
        except ContractRevert as error:
            assert error.name == "BountyOutOfRange" and error.args == (bps, 1_000)


# ------------------------------------------------------------ 11. order of claims and voids


def test_11_equal_work_is_paid_equally_whatever_the_order_of_claims_and_voids(
    staffed: Staffed,
) -> None:
    w, run, a, b, data = staffed.w, staffed.run, staffed.a, staffed.b, staffed.data
    second = w.register("data-2", w.sponsor)
    w.add_data_node(run, second)
    honest = w.certificate_tree(w.pipeline_hops(run, 0, data, [a, b], range(3)))
    cert = w.certify(honest, run, 0, data)
    bad_hop = w.receipt(run, 0, second, a, b, 50, stage=7)  # off the run's stages
    bad = w.certificate_tree([w.signed(bad_hop, a, b)])
    bad_cert = bad.cert_ref(run, 0, second.address)
    w.submit(bad_cert)
    w.prove(fraud_proofs.invalid_hop(bad_cert, bad.leaf_proof(0), bad.entries[0]))  # type: ignore[arg-type]
    w.to_settled(run, 0)
    paid = {}
    for key, wallet in ((b, w.wallet(1)), (a, w.wallet(0))):  # b first this time
        receipt = w.claim(cert, honest, key, wallet)
        (event,) = w.ledger.events.RewardClaimed().process_receipt(receipt, errors=DISCARD)
        paid[key.address] = event["args"]["amountWei"]
    assert paid[a.address] == paid[b.address] == 9 * HOP_PRICE  # 3 forwards, 3 backwards


# ------------------------------------------------------------ 12. front-running a reveal

BOND = TEST_PARAMS.tensor_bond_wei


def equivocation_by(c: Certified, worker_label: str, variant: str) -> fraud_proofs.FraudProof:
    """A proof that ``worker`` signed a second version of its first hop (one per variant)."""
    w = c.w
    key = c.a if worker_label == "a" else c.b
    entry = next(e for e in c.tree.entries if e and e.receipt.worker == key.address)
    other = replace(entry.receipt, outputDigest=keccak(text=variant))
    peer = c.b if key == c.a else c.a
    return fraud_proofs.equivocation(
        key.address, entry.receipt, entry.worker_signature, other,
        w.signed(other, key, peer).worker_signature,
    )  # fmt: skip


def credit_of(w: World, account: str) -> int:
    return int(w.call(w.disputes.functions.creditWei(account)))


def test_12_an_accomplice_front_running_an_auditors_reveal_takes_no_bounty(
    certified: Certified,
) -> None:
    """At stake: the bounty on a's 2 ETH, 0.1 ETH. The auditor commits first; a's accomplice
    commits a proof of the same cheat a block later and, seeing the auditor's reveal in the
    mempool, gets its own reveal mined first. The earlier commitment wins: the auditor takes
    the lead when its reveal lands, within its window, and is paid when the bounty is final."""
    w, a = certified.w, certified.a
    bounty = int(2 * ETH * BOUNTY)
    audit = equivocation_by(certified, "a", "the auditor's")
    front = equivocation_by(certified, "a", "the accomplice's")
    audit_salt = w.commit(audit, w.challenger)
    front_salt = w.commit(front, w.accomplice)
    w.tx(w.reveal_fn(front, front_salt), w.accomplice)  # mined first: a's stake is taken
    assert w.stake_of(a) == 0
    # The bounty is not the first reveal's: nothing is final while an earlier commitment
    # may still be revealed.
    final_after = w.call(w.disputes.functions.convictions(a.address))[3]
    reverts(
        w, w.disputes.functions.awardBounty(a.address), w.accomplice, "BountyNotFinal",
        a.address, final_after, 0,
    )  # fmt: skip
    receipt = w.tx(w.reveal_fn(audit, audit_salt), w.challenger)
    (event,) = w.disputes.events.FraudProven().process_receipt(receipt, errors=DISCARD)
    assert (event["args"]["challenger"], event["args"]["slashedWei"]) == (w.challenger, 0)
    assert event["args"]["bountyWei"] == bounty
    w.award(a.address)
    assert credit_of(w, w.challenger) == bounty and credit_of(w, w.accomplice) == 0
    # Paid once: the stake was taken once and all but the bounty burned.
    assert w.call(w.disputes.functions.burnedWei()) == 2 * ETH - bounty
    reverts(
        w, w.disputes.functions.awardBounty(a.address), w.accomplice, "BountyAwardedAlready",
        a.address,
    )  # fmt: skip


def test_12_a_self_report_kept_in_reserve_expires(certified: Certified) -> None:
    """At stake: the bounty on a's 2 ETH, 0.1 ETH. The accomplice commits a self-report early
    and keeps it to front-run whichever auditor comes; a commitment is revealed within
    revealWindowBlocks or not at all, so by the time the auditor reveals it has expired."""
    w, a = certified.w, certified.a
    reserve = equivocation_by(certified, "a", "the accomplice's")
    reserve_salt = w.commit(reserve, w.accomplice)
    committed_at = w.call(w.disputes.functions.commitments(
        fraud_proofs.commitment_of(w.accomplice, reserve_salt, reserve.proof_hash)
    ))[0]  # fmt: skip
    window = TEST_PARAMS.reveal_window_blocks
    w.tester.mine_blocks(window)
    audit = equivocation_by(certified, "a", "the auditor's")
    audit_salt = w.commit(audit, w.challenger)
    commitment = fraud_proofs.commitment_of(w.accomplice, reserve_salt, reserve.proof_hash)
    reverts(
        w, w.reveal_fn(reserve, reserve_salt), w.accomplice, "CommitmentExpired", commitment,
        committed_at + window,
    )  # fmt: skip
    w.tx(w.reveal_fn(audit, audit_salt), w.challenger)
    w.award(a.address)
    assert credit_of(w, w.challenger) == int(2 * ETH * BOUNTY)
    assert credit_of(w, w.accomplice) == 0


def test_12_voiding_the_tree_first_does_not_shut_out_the_earlier_commitment(
    staffed: Staffed,
) -> None:
    """At stake: the bounty on the data node's 2 ETH, 0.1 ETH. The data node's accomplice
    front-runs the auditor with another proof against the same tree, which voids it; the
    auditor's earlier-committed proof is still judged against the voided tree and wins."""
    w, run = staffed.w, staffed.run
    hop = w.receipt(run, 0, staffed.data, staffed.a, staffed.b, 0, stage=7)  # off the stages
    tree = w.certificate_tree([w.signed(hop, staffed.a, staffed.b)])
    cert = w.certify(tree, run, 0, staffed.data)
    proof = fraud_proofs.invalid_hop(cert, tree.leaf_proof(0), tree.entries[0])  # type: ignore[arg-type]
    audit_salt = w.commit(proof, w.challenger)
    front, front_salt = proof, w.commit(proof, w.accomplice)  # the same proof, its own commitment
    w.tx(w.reveal_fn(front, front_salt), w.accomplice)  # voids the tree first
    w.tx(w.reveal_fn(proof, audit_salt), w.challenger)
    w.award(staffed.data.address)
    assert credit_of(w, w.challenger) == int(2 * ETH * BOUNTY)
    assert credit_of(w, w.accomplice) == 0
    # Two proofs, one slash: the node's chain view lists the data node once.
    slashed = slashes_of(w, run)  # type: ignore[arg-type]
    assert [(s.node, int(s.slashed.wei)) for s in slashed] == [(staffed.data.address, 2 * ETH)]


# ------------------------------------------------------------ 13. blocking a dispute


def wrong_tensor_of(c: Certified, worker: str, microbatch: int = 0) -> fraud_proofs.FraudProof:
    for index, entry in enumerate(c.tree.entries):
        if entry is None:
            continue
        receipt = entry.receipt
        if (
            receipt.worker == worker
            and receipt.direction == 0
            and receipt.microbatchId == microbatch
        ):
            return fraud_proofs.wrong_tensor(c.cert, c.tree.leaf_proof(index), entry)
    raise AssertionError(f"{worker} has no forward of microbatch {microbatch}")


def test_13_an_abandoned_dispute_does_not_block_the_true_one(juried: Juried) -> None:
    """At stake: the bounty on the run's 1 ETH minimum stake that a wrong tensor costs a,
    0.05 ETH. a's accomplice disputes a's receipt first and abandons it (never reveals its
    draw salt, so it loses: its bond goes to a's wallet); the auditor's dispute about the same
    receipt runs beside it and is upheld by the jury."""
    w, a = juried.w, juried.a
    proof = wrong_tensor_of(juried, a.address)
    _, first = jury.open_case(w, proof, w.accomplice)
    _, second = jury.open_case(w, proof, w.challenger)
    jury.reveal_salt(w, second, proof)
    jury.draw(w, second)
    jury.vote(w, second, juried.jurors, jury.honest(jury.WRONG))
    jury.execute(w, second)
    jury.execute(w, first)  # its salt never came: RIGHT
    # The abandoned dispute was committed first, but only a proven commitment ranks.
    w.award(a.address)
    assert credit_of(w, w.challenger) == BOND + int(ETH * BOUNTY)
    assert credit_of(w, w.accomplice) == 0 and credit_of(w, w.wallet(0)) == BOND


# ------------------------------------------------------------ 14. self-conviction


def test_14_a_cheater_convicting_itself_while_a_dispute_is_pending_pays_the_disputer(
    juried: Juried,
) -> None:
    """At stake: the bounty on a's 2 ETH, 0.1 ETH. The auditor's tensor dispute about a is
    pending; a signs two versions of a hop and its accomplice proves that, so a's stake is taken
    with the accomplice leading for the bounty. The bounty waits for the pending dispute, and
    its being upheld puts the auditor, whose commitment came first, in the lead."""
    w, a = juried.w, juried.a
    proof = wrong_tensor_of(juried, a.address)
    _, case_id = jury.open_case(w, proof, w.challenger)
    w.prove(equivocation_by(juried, "a", "self"), w.accomplice)
    assert w.stake_of(a) == 0
    w.tester.mine_blocks(TEST_PARAMS.reveal_window_blocks + 1)
    final_after = w.call(w.disputes.functions.convictions(a.address))[3]
    reverts(
        w, w.disputes.functions.awardBounty(a.address), w.accomplice, "BountyNotFinal",
        a.address, final_after, 1,
    )  # fmt: skip
    jury.reveal_salt(w, case_id, proof)
    jury.draw(w, case_id)
    jury.vote(w, case_id, juried.jurors, jury.honest(jury.WRONG))
    jury.execute(w, case_id)
    w.award(a.address)
    assert credit_of(w, w.challenger) == BOND + int(2 * ETH * BOUNTY)
    assert credit_of(w, w.accomplice) == 0


# ------------------------------------------------------------ 15. frivolous disputes


def test_15_frivolous_disputes_forfeit_their_bonds_to_nobody_the_sponsor_can_reach(
    juried: Juried,
) -> None:
    """At stake: 0.309 ETH of the attacker's bonds and jury fees against honest b. One
    dispute is ruled right by the jury, two are abandoned (no draw salt): each bond goes to b's
    wallet, the fees of the jury that sat to its jurors. The attacker gets back only the
    fees of the two juries never drawn, and neither the sponsor nor the run's funds gain."""
    w, b = juried.w, juried.b
    proofs = [wrong_tensor_of(juried, b.address, microbatch) for microbatch in range(3)]
    cases = [jury.open_case(w, proof, w.attacker)[1] for proof in proofs]
    run_before = w.call(w.ledger.functions.getRun(juried.run))
    jury.reveal_salt(w, cases[0], proofs[0], w.attacker)
    jury.draw(w, cases[0])
    jury.vote(w, cases[0], juried.jurors, jury.honest(jury.RIGHT))
    for case_id in cases:
        jury.execute(w, case_id)
    assert credit_of(w, w.attacker) == 0 and credit_of(w, w.sponsor) == 0
    assert credit_of(w, w.wallet(1)) == 3 * BOND  # b's wallet
    assert jury.credit(w, w.attacker) == 2 * 3 * jury.fee(w)
    assert jury.credit(w, w.sponsor) == 0
    assert w.call(w.ledger.functions.getRun(juried.run)) == run_before
    assert w.stake_of(b) == 4 * ETH
    reverts(w, w.disputes.functions.awardBounty(b.address), w.stranger, "NotConvicted", b.address)


# ------------------------------------------------------------ 21. the sponsor as judge


def test_21_the_sponsor_can_neither_rule_nor_sit_on_the_jury(juried: Juried) -> None:
    """At stake: honest b's 4 ETH. The sponsor opens a dispute against b through an
    accomplice, calls the ruling itself (refused), and holds juror nodes with ten times the
    deposit of all other jurors together; none of them is ever drawn, the honest jury rules
    RIGHT, and the sponsor's accomplice loses its bond to b's wallet."""
    w, b = juried.w, juried.b
    key = w.register("sponsor juror", w.sponsor, ETH)
    w.tx(w.court.functions.deposit(key.address), w.sponsor, 8 * ETH)
    proof = wrong_tensor_of(juried, b.address)
    _, case_id = jury.open_case(w, proof, w.accomplice)
    reverts(w, w.disputes.functions.rule(case_id, jury.WRONG), w.sponsor, "NotCourt", w.sponsor)
    jury.reveal_salt(w, case_id, proof, w.accomplice)
    seats = jury.draw(w, case_id)
    assert set(seats) <= {j.node for j in juried.jurors}
    jury.vote(w, case_id, juried.jurors, jury.honest(jury.RIGHT))
    jury.execute(w, case_id)
    assert w.stake_of(b) == 4 * ETH and credit_of(w, w.wallet(1)) == BOND
    assert credit_of(w, w.sponsor) == jury.credit(w, w.sponsor) == 0


# ------------------------------------------------------------ 22. bribed jurors


def test_22_a_bribed_minority_of_jurors_is_outvoted_and_fined(juried: Juried) -> None:
    """At stake: honest b's 4 ETH. Every juror holding seats but one votes honestly; the
    bribed one votes WRONG. b keeps its stake, and the bribed juror forfeits 20 fees (0.02 ETH
    at the test fee) per seat, burned, while the honest ones earn a fee per seat."""
    w, b = juried.w, juried.b
    for microbatch in range(4):  # until no juror holds all three seats (1 in 64 draws does)
        proof = wrong_tensor_of(juried, b.address, microbatch)
        _, case_id = jury.open_case(w, proof, w.attacker)
        jury.reveal_salt(w, case_id, proof, w.attacker)
        seats = jury.draw(w, case_id)
        if len(set(seats)) > 1:
            break
    bribed = min((j for j in juried.jurors if j.node in seats), key=lambda j: seats.count(j.node))
    before = jury.deposit_of(w, bribed.node)
    jury.vote(w, case_id, juried.jurors, lambda j: jury.WRONG if j == bribed else jury.RIGHT)
    receipt = jury.execute(w, case_id)
    assert w.stake_of(b) == 4 * ETH
    settled = jury.settled(w, receipt)
    assert settled[(0, bribed.node)] == (False, jury.penalty(w))
    assert jury.deposit_of(w, bribed.node) == before - jury.penalty(w)
    for node in set(seats) - {bribed.node}:
        assert settled[(0, node)] == (True, seats.count(node) * jury.fee(w))


# ------------------------------------------------------------ 24. a whole stake for one hop


def test_24_one_wrong_tensor_takes_only_the_runs_minimum_stake(juried: Juried) -> None:
    """At stake: b's 4 ETH. An attacker who bought or got a WRONG ruling on one of b's hops
    (here the whole jury votes WRONG) would take b's whole stake for one disputed hop. A wrong
    tensor takes at most the run's minimum stake (1 ETH: the exposure every member of the run
    posts, and what the conviction's epoch puts at risk); the other 3 ETH stay b's, b stays
    active, and another hop of the same (run, epoch) cannot be disputed again. Certificate fraud
    by a data node still takes its whole stake (test_5, test_18)."""
    w, b = juried.w, juried.b
    assert w.stake_of(b) == 4 * ETH
    proof = wrong_tensor_of(juried, b.address)
    _, _, receipt = jury.whole_case(w, proof, juried.jurors, jury.honest(jury.WRONG), w.attacker)
    (event,) = w.disputes.events.FraudProven().process_receipt(receipt, errors=DISCARD)
    assert event["args"]["slashedWei"] == ETH
    assert w.stake_of(b) == 3 * ETH and w.status_of(b) == 1  # still active
    # Another hop of the same (run, epoch) cannot take a second bite.
    second = wrong_tensor_of(juried, b.address, 1)
    proof_reverts(w, second, "AlreadySlashed", b.address)
    w.award(b.address)
    assert credit_of(w, w.attacker) == BOND + int(ETH * BOUNTY)  # its bond back and the bounty
    # The rest is b's to withdraw after the unbonding delay.
    w.tx(w.registry.functions.requestUnstake(b.address), w.wallet(1))
    w.travel_to(int(w.call(w.registry.functions.unlockAt(b.address))))
    before = w.balance(w.wallet(1))
    w.tx(w.registry.functions.withdrawStake(b.address), w.wallet(1))
    assert w.balance(w.wallet(1)) > before + 3 * ETH - ETH // 100  # less gas
