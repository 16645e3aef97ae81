"""The jury's entry reads a case's batch proof from the event that opened it: one longer than
any proof a juror processes is skipped with one warning line, never handed to a replay that
would raise on it (the ledger refuses such a dispute; a ledger deployed without that bound
could still emit one)."""

from __future__ import annotations

import logging

import pytest

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
