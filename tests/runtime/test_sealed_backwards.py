"""A relay's seals of the microbatches whose holds their origin was answered stay bounded, and
one origin cannot crowd another's out; an answer that seals nothing says so, once per cause."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import trio

from gwtf.node.runtime.dataplane import control
from gwtf.node.runtime.roles.relay import RelayRole
from gwtf.node.runtime.roles.sealed_backwards import MAX_ORIGINS, SealedBackwards
from tests.runtime.test_forget_iteration import ITERATION, relay_holding


def test_a_seal_covers_only_its_origins_microbatches_of_its_iteration() -> None:
    seals = SealedBackwards()
    assert seals.seal(5, "data-a", 40, 44, step=5)
    assert seals.covers(5, "data-a", 40) and seals.covers(5, "data-a", 43)
    assert not seals.covers(5, "data-a", 44) and not seals.covers(5, "data-a", 39)
    assert not seals.covers(5, "data-b", 41) and not seals.covers(6, "data-a", 41)


def test_an_origins_chunks_merge_into_one_span() -> None:
    seals = SealedBackwards()
    for first in range(0, 3072, 1024):
        seals.seal(2, "data-a", first, first + 1024, step=2)
    assert seals.spans == {2: {"data-a": (0, 3072)}}


def test_holds_of_iterations_far_from_the_relays_step_keep_nothing() -> None:
    """Asked about any iteration a peer likes, a relay kept a set per iteration for good."""
    seals = SealedBackwards()
    for iteration in (0, 3, 10**9, 2**62):
        assert not seals.seal(iteration, "data-a", 0, 4, step=4)
    assert seals.spans == {}
    assert seals.seal(5, "data-a", 0, 4, step=4)  # the next: a relay a little behind


def test_one_origin_asking_many_ranges_leaves_room_for_another() -> None:
    """Ranges were bounded per iteration for all origins together: one stage-0 peer asking
    about made-up ranges filled the room, and an honest data node's holds sealed nothing."""
    seals = SealedBackwards()
    for first in range(0, 4 * MAX_ORIGINS, 2):
        seals.seal(1, "sybil", first, first + 1, step=1)
    assert seals.seal(1, "data-a", 4, 8, step=1)
    assert seals.covers(1, "data-a", 7)


def test_the_number_of_origins_is_bounded() -> None:
    seals = SealedBackwards()
    for n in range(MAX_ORIGINS):
        assert seals.seal(1, f"origin-{n}", 0, 1, step=1)
    assert not seals.seal(1, "one-more", 0, 1, step=1)
    assert seals.seal(1, "origin-0", 1, 2, step=1)  # a known origin still widens its span


def test_forget_lifts_the_askers_seal_only_and_old_iterations_drop() -> None:
    seals = SealedBackwards()
    seals.seal(3, "data-a", 0, 4, step=3)
    seals.seal(3, "data-b", 4, 8, step=3)
    seals.seal(4, "data-a", 8, 12, step=3)
    seals.lift(3, "data-a")
    assert not seals.covers(3, "data-a", 1) and seals.covers(3, "data-b", 5)
    seals.drop_before(4)
    assert seals.spans == {4: {"data-a": (8, 12)}}
    seals.lift(4, "data-a")
    assert seals.spans == {}


def answer_holds(role: RelayRole, asks: list[tuple[str, int | None]]) -> None:
    """``role`` answers ``Holds`` of microbatches 0..3 of ``ITERATION`` to each (asker, the
    stage its card says)."""
    role.plane = SimpleNamespace(  # type: ignore[assignment]
        ack_deadline_s=5.0, node_id="relay", stages=2, backwards_here=lambda _iteration: False
    )

    async def ask() -> None:
        for asker, stage in asks:
            await role.holds(control.Holds(ITERATION, 0, 4), asker, stage)

    trio.run(ask)


SEAL_WARNING = "seal nothing"


def test_holds_from_an_asker_without_a_card_warn_once_that_nothing_is_sealed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    role = relay_holding({0: "data", 1: "data"})
    with caplog.at_level(logging.WARNING, logger="gwtf.node.runtime.roles.relay"):
        answer_holds(role, [("data", None)] * 3)
    assert not role._sealed.covers(ITERATION, "data", 0)
    warned = [m for m in caplog.messages if SEAL_WARNING in m]
    assert len(warned) == 1 and "no signed card" in warned[0], warned


def test_holds_past_the_bound_on_origins_warn_once_and_the_other_cause_too(
    caplog: pytest.LogCaptureFixture,
) -> None:
    role = relay_holding({0: "data"})
    for n in range(MAX_ORIGINS):
        assert role._sealed.seal(ITERATION, f"origin-{n}", 0, 1, step=ITERATION)
    with caplog.at_level(logging.WARNING, logger="gwtf.node.runtime.roles.relay"):
        answer_holds(role, [("data", 0), ("data-b", 0), ("origin-0", 0), ("x", None)])
    assert not role._sealed.covers(ITERATION, "data", 0)
    warned = [m for m in caplog.messages if SEAL_WARNING in m]
    assert len(warned) == 2, warned
    assert f"more than {MAX_ORIGINS} data nodes" in warned[0] and "no signed card" in warned[1]


def test_holds_from_a_carded_data_node_seal_without_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    role = relay_holding({0: "data"})
    with caplog.at_level(logging.WARNING, logger="gwtf.node.runtime.roles.relay"):
        answer_holds(role, [("data", 0), ("relay-b", 2)])
    assert role._sealed.covers(ITERATION, "data", 3)
    assert not role._sealed.covers(ITERATION, "relay-b", 3)
    assert not [m for m in caplog.messages if SEAL_WARNING in m]
