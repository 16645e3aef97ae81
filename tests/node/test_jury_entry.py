"""The jury's entry reads a case's batch proof from the event that opened it: one longer than
any proof a juror processes is flagged with one warning line, never handed to a replay that
would raise on it (the ledger refuses such a dispute; a ledger deployed without that bound
could still emit one). The case is kept, so its answer, draw and ruling still happen, and its
jurors vote RIGHT (not shown wrong) rather than be fined as absent."""

from __future__ import annotations

import logging

import pytest
import trio

from gwtf.contracts.encoding import FORWARD, HopReceipt, ledger_domain
from gwtf.contracts.merkle import MAX_PROOF_LENGTH
from gwtf.node.audit import jury


def test_an_oversize_batch_proof_is_skipped_with_one_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    hashes = [bytes([i]) * 32 for i in range(MAX_PROOF_LENGTH + 1)]
    with caplog.at_level(logging.WARNING, logger=jury.__name__):
        assert jury.batch_proof_of(7, hashes) is None
    (line,) = [r.getMessage() for r in caplog.records]
    assert "case 7" in line and f"{MAX_PROOF_LENGTH + 1} hashes" in line


def test_a_proof_within_the_bound_is_kept() -> None:
    hashes = [bytes([i]) * 32 for i in range(MAX_PROOF_LENGTH)]
    assert jury.batch_proof_of(7, hashes) == tuple(hashes)


def test_a_case_whose_proof_no_juror_checks_is_voted_right() -> None:
    r = HopReceipt(1, 0, "0x" + "33" * 20, 3, 7, 1, FORWARD, 0, "0x" + "11" * 20,
                   "0x" + "22" * 20, b"\1" * 32, b"\2" * 32, 1)  # fmt: skip
    case = jury.Case(1, 1, r, b"\0" * 32, b"", "0x" + "44" * 20, "0x" + "55" * 20,
                     checkable=False)  # fmt: skip
    domain = ledger_domain(1, "0x" + "66" * 20)
    vote, why = trio.run(jury._verdict, case, [], None, 1.0, domain, None)
    assert vote == jury.RIGHT and why.startswith("not shown wrong"), why
