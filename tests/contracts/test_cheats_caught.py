"""Every cheat of ``gwtf.node.receipts.cheats`` against the real auditor and the real contracts: the
cheating node serves what its cheat makes (its real libp2p host, in public), ``gwtf-node
challenge`` audits the epoch over p2p, proves each fraud the chain judges alone, and the cheater
alone is slashed, with the bounty withdrawn to the challenger's wallet; run again it sends
nothing, and a run cut off after its commitment reveals it when run again. A withheld leaf is
found, fails the audit and slashes nobody: no contract sees it."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from contextlib import ExitStack, asynccontextmanager, contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from eth_account import Account

from gwtf.contracts.bindings import committed_spans, deploy_contract
from gwtf.contracts.certificate_tree import (
    PreparedHop,
    SignedReceipt,
    spans_of,
    tree_of_prepared,
)
from gwtf.contracts.encoding import sign_binding
from gwtf.node.audit.challenge import JUDGED_BEFORE, SLASHED, challenge, salt_of
from gwtf.node.audit.checks import equivocations
from gwtf.node.chain.actions import Contracts, commit_proof
from gwtf.node.chain.adapter import NODE_STATUS_SLASHED, Sender
from gwtf.node.chain.wallet import create_wallet
from gwtf.node.cli.audit import EXIT_FINDINGS
from gwtf.node.cli.main import main
from gwtf.node.p2p.host import full_address, running_host
from gwtf.node.p2p.identity import identity_from_key
from gwtf.node.p2p.rpc import PublicRate, RequestResponse
from gwtf.node.receipts.cheats import (
    CLAIM_TWICE,
    EQUIVOCATE,
    FORGE_COUNTERSIGNATURE,
    INFLATE_UNITS,
    PHANTOM_HOPS,
    SHIFT_SPAN,
    WITHHOLD_LEAF,
    Cheat,
)
from gwtf.node.receipts.serving import _REQUEST as _RECEIPTS_REQUEST
from gwtf.node.receipts.serving import RECEIPTS_PROTOCOL, SIGNED, _limits
from gwtf.node.receipts.wire import ReceiptPage, encode_page
from tests.contracts.conftest import TEST_PARAMS, Staffed
from tests.contracts.test_audit_command import (  # noqa: F401
    audit,
    devnet_file,
    serving_data_node,
)
from tests.contracts.world import ETH, UNITS_PER_HOP, NodeKey, default_capacity
from tests.served import served_in_a_thread

PASSWORD = "challenger password"


def challenger_wallet(s: Staffed, tmp_path: Path) -> tuple[Path, Path]:
    """A keystore funded with 1 ETH, and its password file."""
    path, password = tmp_path / "challenger.json", tmp_path / "password"
    account = create_wallet(path, PASSWORD, scrypt_n=2**10)
    password.write_text(PASSWORD)
    s.w.w3.eth.send_transaction({"from": s.w.challenger, "to": account.address, "value": ETH})
    return path, password


def run_challenge(
    capsys: pytest.CaptureFixture[str], devnet: Path, wallet: tuple[Path, Path], run: int,
    peers: list[str], *flags: str,
) -> tuple[int, dict[str, Any]]:  # fmt: skip
    argv = ["--devnet-file", str(devnet), "challenge", "--run", str(run), "--epoch", "0"]
    argv += ["--wallet", str(wallet[0]), "--password-file", str(wallet[1]), "--json", *flags]
    argv += [flag for peer in peers for flag in ("--peer", peer)] + ["--timeout-s", "10"]
    code = main(argv)
    return code, json.loads(capsys.readouterr().out)


def honest_hops(s: Staffed) -> list[SignedReceipt]:
    """Two microbatches through a (stage 1) and b (stage 2)."""
    return s.w.pipeline_hops(s.run, 0, s.data, [s.a, s.b], [0, 1])


def submit(s: Staffed, entries: list[SignedReceipt], cheat: Cheat | None = None) -> Any:
    """The data node's tree of ``entries`` as its cheat (if any) makes it, submitted."""
    chosen = [PreparedHop.of(e, s.w.ledger_domain) for e in entries]
    if cheat is not None:
        chosen = cheat.certify(chosen)
    tree = tree_of_prepared(chosen)
    s.w.to_submission(s.run, 0)
    cert = tree.cert_ref(s.run, 0, s.data.address)
    spans = tree.spans_or_raise()
    if cheat is not None:
        cert, spans = cheat.certificate(cert, spans)
    s.w.submit(cert, spans=spans)
    return tree.with_spans(spans)  # as the data node serves it


def cheat_of(s: Staffed, mode: str, key: NodeKey) -> Cheat:
    return Cheat(mode, key.private_key, s.w.ledger_domain, UNITS_PER_HOP)


DATA_NODE_CHEATS = {
    FORGE_COUNTERSIGNATURE: ("invalid hop", "countersignature is not the counterparty's"),
    PHANTOM_HOPS: ("invalid hop", "countersigned by its own worker"),
    INFLATE_UNITS: ("bad totals", "contradicts count or units"),
    SHIFT_SPAN: ("bad span", "span 0: the span of"),
}


@pytest.mark.parametrize("mode", DATA_NODE_CHEATS)
def test_a_cheating_data_node_is_found_slashed_and_its_certificate_voided(
    mode: str, staffed: Staffed, devnet_file: Path, tmp_path: Path,  # noqa: F811
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    s, (kind, why) = staffed, DATA_NODE_CHEATS[mode]
    cheat = cheat_of(s, mode, s.data)
    tree = submit(s, honest_hops(s), cheat)
    wallet = challenger_wallet(s, tmp_path)
    with serving_data_node(s, s.data, tree, tmp_path / "d.sqlite", cheat) as at:
        code, report = run_challenge(capsys, devnet_file, wallet, s.run, [at])
        s.w.tester.mine_blocks(TEST_PARAMS.reveal_window_blocks)  # the bounty becomes final
        again, report_again = run_challenge(capsys, devnet_file, wallet, s.run, [at])
    assert code == 0, report
    first, *rest = report["challenges"]
    assert first["kind"] == kind and why in first["detail"], first
    assert first["accused"] == s.data.address and first["outcome"] == "slashed"
    assert int(first["slashed_wei"]) == 2 * ETH and int(first["bounty_wei"]) == 2 * ETH // 20
    assert all(r["outcome"] == "already judged" for r in rest), rest  # the same certificate
    # The bounty waits until no earlier commitment can be revealed.
    assert int(report["withdrawn_wei"]) == 0
    assert s.w.status_of(s.data) == NODE_STATUS_SLASHED
    assert all(s.w.status_of(k) != NODE_STATUS_SLASHED for k in (s.a, s.b, s.c)), "nobody else"
    # Run again once the reveal window closed: the findings are still there, judged (the
    # certificate is voided); nothing is sent, the final bounty is awarded and withdrawn.
    again_found = report_again["certificates"][0]["findings"]
    assert again_found and all(f["judged"] and not f["provable_on_chain"] for f in again_found)
    assert report_again["challenges"] == []
    assert int(report_again["withdrawn_wei"]) == 2 * ETH // 20
    assert again == 0


@pytest.mark.parametrize("served", ["no spans", "its tree's own spans"])
def test_shifted_spans_are_proven_whatever_spans_the_data_node_serves(
    served: str, staffed: Staffed, devnet_file: Path, tmp_path: Path,  # noqa: F811
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """A data node that shifts a span and then serves no spans, or its tree's true ones
    (not those it committed), is convicted all the same: the spans are read from the
    ledger's event of their submission, not taken from the accused."""
    s = staffed
    cheat = cheat_of(s, SHIFT_SPAN, s.data)
    committed = submit(s, honest_hops(s), cheat)
    true_spans = spans_of(committed.hops)
    assert true_spans is not None and true_spans != committed.spans
    shown = (
        replace(committed, spans=None, ranges=None)
        if served == "no spans"
        else committed.with_spans(true_spans)
    )
    wallet = challenger_wallet(s, tmp_path)
    with serving_data_node(s, s.data, shown, tmp_path / "d.sqlite", cheat) as at:
        code, report = run_challenge(capsys, devnet_file, wallet, s.run, [at])
    assert code == 0, report
    first = report["challenges"][0]
    assert first["kind"] == "bad span" and first["outcome"] == "slashed", first
    assert s.w.status_of(s.data) == NODE_STATUS_SLASHED


@pytest.mark.parametrize("served", ["its tree's own spans", "no spans"])
def test_spans_submitted_through_a_contract_wallet_are_read_from_the_event(
    served: str, staffed: Staffed, devnet_file: Path, tmp_path: Path,  # noqa: F811
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """A sponsor whose wallet is a contract submits its data node's certificate through it: the
    auditor still reads the committed spans from the ledger's event, not from the data node, and
    proves a shifted one whatever spans the data node serves."""
    w = staffed.w
    wallet = deploy_contract(w.w3, "ReentrantWallet", w.attacker)

    def through_wallet(target: Any, function: str, *args: Any, value: int = 0) -> None:
        data = target.encode_abi(function, args=list(args))
        w.tx(wallet.functions.execute(target.address, data), w.attacker, value)

    data = w.key("data with a contract wallet")
    binding = sign_binding(wallet.address, data.private_key, w.registry_domain)
    capacity = default_capacity()
    through_wallet(w.registry, "registerNode", data.public_key, capacity, binding, value=2 * ETH)
    through_wallet(w.ledger, "openRun", w.run_config(), value=10 * ETH)
    run = int(w.ledger.events.RunOpened.get_logs(from_block=0)[-1]["args"]["runId"])
    through_wallet(w.ledger, "addDataNode", run, data.address)
    for key, i in ((staffed.a, 0), (staffed.b, 1)):
        w.join(run, key, w.wallet(i))
    s = replace(staffed, run=run, data=data)
    cheat = cheat_of(s, SHIFT_SPAN, data)
    entries = w.pipeline_hops(run, 0, data, [s.a, s.b], [0, 1])
    tree = tree_of_prepared([PreparedHop.of(e, w.ledger_domain) for e in entries])
    w.to_submission(s.run, 0)
    cert, spans = cheat.certificate(tree.cert_ref(s.run, 0, data.address), tree.spans_or_raise())
    args = (cert.runId, cert.epoch, cert.dataNode, cert.root, cert.count, cert.units)
    through_wallet(w.ledger, "submitCertificates", *args, [span.as_tuple() for span in spans])
    assert committed_spans(w.ledger, cert) == tuple(spans)
    shown = tree if served == "its tree's own spans" else replace(tree, spans=None, ranges=None)
    challenger = challenger_wallet(s, tmp_path)
    with serving_data_node(s, data, shown, tmp_path / "d.sqlite", cheat) as at:
        code, report = run_challenge(capsys, devnet_file, challenger, s.run, [at])
    assert code == 0, report
    first = report["challenges"][0]
    assert first["kind"] == "bad span" and first["outcome"] == "slashed", first
    assert w.status_of(data) == NODE_STATUS_SLASHED


def test_a_withheld_leaf_fails_the_audit_and_slashes_nobody(
    staffed: Staffed, devnet_file: Path, tmp_path: Path,  # noqa: F811
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    s = staffed
    cheat = cheat_of(s, WITHHOLD_LEAF, s.data)
    tree = submit(s, honest_hops(s), cheat)
    wallet = challenger_wallet(s, tmp_path)
    with serving_data_node(s, s.data, tree, tmp_path / "d.sqlite", cheat) as at:
        code, report = run_challenge(capsys, devnet_file, wallet, s.run, [at])
    assert code == EXIT_FINDINGS
    (finding,) = report["certificates"][0]["findings"]
    assert finding["kind"] == "withheld" and not finding["provable_on_chain"]
    assert finding["detail"] == f"1 of {tree.count} leaves not served"
    assert report["certificates"][0]["leaves_served"] == tree.count - 1
    assert report["challenges"] == []
    assert all(s.w.status_of(k) != NODE_STATUS_SLASHED for k in (s.data, s.a, s.b, s.c))


@pytest.mark.parametrize("mode", [CLAIM_TWICE, EQUIVOCATE])
def test_a_relay_that_signs_two_versions_of_a_hop_is_slashed_and_nobody_else(
    mode: str, staffed: Staffed, devnet_file: Path, tmp_path: Path,  # noqa: F811
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    s = staffed
    entries = honest_hops(s)
    tree = submit(s, entries)  # an honest data node certifies the first version
    # b computed stage 2 and received a's forwards: as worker it claims one twice, or as
    # counterparty it countersigns a second version of one.
    cheater = s.b
    cheat = cheat_of(s, mode, cheater)
    for entry in entries:
        if mode == CLAIM_TWICE and entry.receipt.worker == cheater.address:
            cheat.signed(entry)
        if mode == EQUIVOCATE and entry.receipt.counterparty == cheater.address:
            cheat.received(entry)
    wallet = challenger_wallet(s, tmp_path)
    with ExitStack() as stack:
        data = stack.enter_context(serving_data_node(s, s.data, tree, tmp_path / "d.sqlite"))
        relay = stack.enter_context(
            serving_data_node(s, cheater, None, tmp_path / "b.sqlite", cheat)
        )
        code, report = run_challenge(capsys, devnet_file, wallet, s.run, [data, relay])
    assert code == 0, report
    (judged,) = report["challenges"]
    role = "worker" if mode == CLAIM_TWICE else "counterparty"
    assert judged["kind"] == "equivocation" and f"as {role}" in judged["detail"]
    assert judged["accused"] == cheater.address and judged["outcome"] == "slashed"
    assert int(judged["slashed_wei"]) == 4 * ETH  # b's whole stake
    assert s.w.status_of(cheater) == NODE_STATUS_SLASHED
    assert all(s.w.status_of(k) != NODE_STATUS_SLASHED for k in (s.data, s.a, s.c))


def test_a_challenge_cut_off_after_its_commitment_reveals_it_when_run_again(
    staffed: Staffed,
) -> None:
    """The salt comes from the challenger's key and the proof: a run stopped after its commit
    finds the commitment on chain and only reveals; a third run finds the signer slashed."""
    s, w = staffed, staffed.w
    entry = honest_hops(s)[0]  # a's forward, countersigned by b
    cheat = cheat_of(s, EQUIVOCATE, s.b)
    cheat.received(entry)
    (finding,) = equivocations([entry, *cheat.extras[(0, 1)]], w.ledger_domain)
    assert finding.proof is not None and finding.accused == s.b.address
    contracts = Contracts(w.w3, w.registry, w.ledger, w.disputes, w.court)
    challenger = Sender.from_account(Account.create())
    w.w3.eth.send_transaction({"from": w.challenger, "to": challenger.address, "value": ETH})
    commit_proof(contracts, challenger, finding.proof, salt_of(challenger, finding.proof))
    done = challenge(contracts, challenger, [finding])
    (judged,) = done.judgements
    assert judged.outcome == SLASHED and judged.slashed_wei == 4 * ETH
    commits = w.disputes.events.ProofCommitted.get_logs(from_block=0)
    assert [c["args"]["challenger"] for c in commits] == [challenger.address], "one commitment"
    assert done.withdrawn_wei == 0  # final once no earlier commitment can be revealed
    w.tester.mine_blocks(TEST_PARAMS.reveal_window_blocks)
    done_again = challenge(contracts, challenger, [finding])
    (again,) = done_again.judgements
    assert again.outcome == JUDGED_BEFORE
    assert again.detail == "its signer is convicted in epoch 0 already"
    assert done_again.withdrawn_wei == 4 * ETH // 20 and w.balance(challenger.address) > ETH


def test_a_slashed_signer_is_still_proven_at_fault_in_another_epoch(staffed: Staffed) -> None:
    """b equivocates in epochs 0 and 1. Convicted in epoch 0 (its 4 ETH stake taken), b is
    still proven at fault in epoch 1, where the chain then burns its pay; only the finding of
    epoch 0 is skipped as judged."""
    s, w = staffed, staffed.w
    cheat = cheat_of(s, EQUIVOCATE, s.b)
    findings = []
    for epoch in (0, 1):
        entry = w.pipeline_hops(s.run, epoch, s.data, [s.a, s.b], [0])[0]  # a's, b countersigns
        cheat.received(entry)
        (finding,) = equivocations([entry, *cheat.extras[(epoch, 1)]], w.ledger_domain)
        assert finding.proof is not None and finding.proof.epoch == epoch
        findings.append(finding)
    contracts = Contracts(w.w3, w.registry, w.ledger, w.disputes, w.court)
    challenger = Sender.from_account(Account.create())
    w.w3.eth.send_transaction({"from": w.challenger, "to": challenger.address, "value": ETH})
    (first,) = challenge(contracts, challenger, findings[:1]).judgements
    assert first.outcome == SLASHED and first.slashed_wei == 4 * ETH
    assert not w.call(w.ledger.functions.isConvictedIn(s.run, 1, s.b.address))
    w.tester.mine_blocks(TEST_PARAMS.reveal_window_blocks)  # no earlier commitment can lead
    again, further = challenge(contracts, challenger, findings).judgements
    assert again.outcome == JUDGED_BEFORE, again
    assert further.outcome == SLASHED and further.slashed_wei == 0, further
    assert w.call(w.ledger.functions.isConvictedIn(s.run, 1, s.b.address))


@contextmanager
def serving_malformed(s: Staffed, node: NodeKey, entry: SignedReceipt) -> Iterator[str]:
    """``node``'s host serving, as its signed receipts, ``entry`` with signatures that recover
    to nobody (a page that decodes, whose every signature the search fails to recover), and as
    its countersigned ones, bytes that are no page."""
    nobody = replace(entry, worker_signature=bytes(65), counterparty_signature=bytes(65))

    async def answer(_peer: str, request: bytes) -> bytes:
        _, _, which, _, _ = _RECEIPTS_REQUEST.unpack(request)
        if which == SIGNED:
            return encode_page(ReceiptPage(1, 0, (nobody,)))
        return b"no receipt page"

    @asynccontextmanager
    async def hosts() -> AsyncIterator[str]:
        async with running_host(identity_from_key(node.private_key)) as host:
            RequestResponse(host).serve(RECEIPTS_PROTOCOL, answer, _limits(5.0), PublicRate())
            yield full_address(host)

    with served_in_a_thread(hosts) as address:
        yield address


def test_a_peers_malformed_receipts_do_not_stop_the_equivocation_search(
    staffed: Staffed, devnet_file: Path, tmp_path: Path,  # noqa: F811
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """A peer (c, read before b) serving receipts whose signatures recover to nobody and a
    page that does not decode is reported read in part, accusing nobody; the search goes on
    and finds b, which countersigned two versions of a hop."""
    s = staffed
    entries = honest_hops(s)
    tree = submit(s, entries)
    cheat = cheat_of(s, EQUIVOCATE, s.b)
    for entry in entries:
        if entry.receipt.counterparty == s.b.address:
            cheat.received(entry)
    with ExitStack() as stack:
        data = stack.enter_context(serving_data_node(s, s.data, tree, tmp_path / "d.sqlite"))
        bad = stack.enter_context(serving_malformed(s, s.c, entries[0]))
        relay = stack.enter_context(serving_data_node(s, s.b, None, tmp_path / "b.sqlite", cheat))
        code, report = audit(capsys, devnet_file, s.run, data, bad, relay)
    assert code == EXIT_FINDINGS, report
    (found,) = report["equivocations"]
    assert found["accused"] == s.b.address and found["provable_on_chain"], found
    assert report["peers"][s.c.address].startswith("served receipts only in part"), report
    assert all(f["accused"] != s.c.address for f in report["equivocations"])
