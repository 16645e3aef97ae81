"""A juror takes a hop's replicas and forwards only from a certificate that stands on chain: a
data node's certificate voided by a fraud proof names nobody, though its leaves verify
against its root all the same, and the juror's reason says so (a real eth-tester chain, the
data node and the relay serving over real libp2p hosts, a real stage re-executed)."""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path

import trio

from gwtf.node.audit import jury
from gwtf.node.audit.reexecute import Replayer
from gwtf.node.chain.actions import Contracts
from tests.contracts.conftest import Staffed
from tests.contracts.test_audit_command import serving_data_node
from tests.contracts.test_juror_backward import SETTINGS, case_of, keep_signed, worked_backward
from tests.contracts.test_rewards import void_by_bad_totals
from tests.contracts.world import TEST_GAS_LIMIT, UNITS_PER_HOP

VOIDED = "its data node's certificate is voided on chain: no replica named"


def test_a_voided_certificate_names_no_replica_and_the_verdict_says_so(
    staffed: Staffed, tmp_path: Path
) -> None:
    s, w = staffed, staffed.w
    made = worked_backward(s, tmp_path, wrong=False)
    tree = w.certificate_tree([made["forward"], made["backward"]])
    w.to_submission(s.run, 0)
    # Units one hop's worth over its leaves': a certificate ``proveBadTotals`` voids.
    cert = w.cert_of(tree, s.run, 0, s.data.address, units=tree.units + UNITS_PER_HOP)
    w.submit(cert)
    contracts = Contracts(w.w3, w.registry, w.ledger, w.disputes, w.court, gas_limit=TEST_GAS_LIMIT)
    receipt = made["backward"].receipt
    assert jury.certificate_of(contracts, receipt) == (cert, "")

    void_by_bad_totals(w, cert, tree)
    assert jury.certificate_of(contracts, receipt) == (None, VOIDED)

    keep_signed(tmp_path / "a.sqlite", s, [made["forward"], made["backward"]])
    with ExitStack() as stack:
        peers = [
            # The data node still serves the voided tree: its leaves verify, and name nobody.
            stack.enter_context(serving_data_node(s, s.data, tree, tmp_path / "data.sqlite")),
            stack.enter_context(
                serving_data_node(s, s.a, None, tmp_path / "a.sqlite", evidence=made["archive"])
            ),
        ]
        replayer = Replayer(made["plan"], SETTINGS)
        vote, why = trio.run(
            jury.juror_verdict, contracts, case_of(s, made["backward"]), peers, replayer, 10.0
        )
    assert vote == jury.RIGHT, why
    assert why.endswith(f"({VOIDED})"), why


def test_a_data_node_without_a_certificate_names_no_replica(staffed: Staffed) -> None:
    s, w = staffed, staffed.w
    contracts = Contracts(w.w3, w.registry, w.ledger, w.disputes, w.court, gas_limit=TEST_GAS_LIMIT)
    receipt = w.receipt(s.run, 0, s.data, s.a, s.data, 1, stage=2)
    cert, why = jury.certificate_of(contracts, receipt)
    assert cert is None and "certified no hop" in why
