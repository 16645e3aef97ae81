"""Peer scores fall with offences, recover with time, and ban below the threshold."""

from __future__ import annotations

from gwtf.node.p2p.scoring import Offence, PeerScores, ScoringConfig


def test_offences_lower_the_score_and_time_restores_it() -> None:
    scores = PeerScores(ScoringConfig(ban_below=-50.0, recovery_per_s=1.0))
    assert scores.penalise("p", Offence.OVERSIZED_FRAME, now=0.0) == -20.0
    assert scores.score("p", now=5.0) == -15.0
    assert scores.score("p", now=100.0) == 0.0
    assert scores.score("stranger", now=3.0) == 0.0


def test_repeated_garbage_bans_and_the_ban_expires() -> None:
    scores = PeerScores(ScoringConfig(ban_below=-50.0, recovery_per_s=1.0))
    for _ in range(6):
        scores.penalise("p", Offence.MALFORMED_MESSAGE, now=0.0)
    assert scores.is_banned("p", now=0.0)
    assert not scores.is_banned("other", now=0.0)
    assert not scores.is_banned("p", now=11.0)


def test_offences_of_equal_cost_are_recorded_under_their_own_names() -> None:
    scores = PeerScores()
    scores.penalise("p", Offence.HANDLER_FAILURE, now=0.0)
    scores.penalise("p", Offence.TIMEOUT, now=0.0)
    assert [offence.name for offence in scores.offences["p"]] == ["HANDLER_FAILURE", "TIMEOUT"]
    assert len({offence.value for offence in Offence}) == len(Offence.__members__)
    assert scores.score("p", now=0.0) == -10.0
