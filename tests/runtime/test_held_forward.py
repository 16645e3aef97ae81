"""When a second forward of a microbatch a relay holds may replace the held one
(``held_forward.check_second_forward``), and the origin's ``current_try`` answer on the wire."""

from __future__ import annotations

import pytest
import trio

from gwtf.errors import ProtocolError
from gwtf.node.p2p.identity import new_identity, peer_id_of
from gwtf.node.p2p.rpc import Decline
from gwtf.node.runtime.dataplane import control
from gwtf.node.runtime.dataplane.hop import (
    ATTEMPT_BLOCK,
    FLAG_REPAIR,
    FLAG_RESUME,
    FORWARD,
    HopHeader,
)
from gwtf.node.runtime.roles.data_peers import shard_microbatches
from gwtf.node.runtime.roles.held_forward import check_second_forward

ORIGIN, OTHER, UP, MEMBER = (str(peer_id_of(new_identity())) for _ in range(4))
HELD = HopHeader(1, 0, 7, 0, FORWARD, 2, 0, 0, ORIGIN, (ORIGIN, UP))
HELD_INPUT, OTHER_INPUT = b"\x01" * 32, b"\x02" * 32


def outcome(header: HopHeader, digest: bytes, started: int | None) -> tuple[str, int]:
    """'replaced' or the decline's words, and how often the origin was asked."""
    asked: list[tuple[str, int, int]] = []

    async def ask_try(origin: str, iteration: int, microbatch: int) -> tuple[int, int] | None:
        asked.append((origin, iteration, microbatch))
        return None if started is None else (started, 4 * ATTEMPT_BLOCK)

    async def main() -> str:
        try:
            await check_second_forward(HELD, HELD_INPUT, header, digest, ask_try)
        except Decline as exc:
            return str(exc)
        return "replaced"

    result = trio.run(main)
    assert all(a == (ORIGIN, 0, 7) for a in asked)
    return result, len(asked)


def test_a_second_forward_from_the_held_input_is_computed_without_asking() -> None:
    for flags in (0, FLAG_REPAIR, FLAG_RESUME):
        same = HELD.onward(attempt=1, flags=flags, path=(ORIGIN, MEMBER))
        assert outcome(same, HELD_INPUT, None) == ("replaced", 0)


def test_a_restart_the_origin_names_replaces_a_forward_of_an_earlier_try() -> None:
    # re-sent once within the new try
    restart = HELD.onward(attempt=ATTEMPT_BLOCK + 1, try_start=ATTEMPT_BLOCK)
    assert outcome(restart, OTHER_INPUT, ATTEMPT_BLOCK) == ("replaced", 1)
    resumed = restart.onward(attempt=3 * ATTEMPT_BLOCK, flags=FLAG_RESUME)  # a repair of that try
    assert outcome(resumed, OTHER_INPUT, ATTEMPT_BLOCK) == ("replaced", 1)


@pytest.mark.parametrize(
    ("attempt", "try_start", "started", "why"),
    [
        (ATTEMPT_BLOCK, 0, 0, "the held forward is of the try in progress"),
        (ATTEMPT_BLOCK, ATTEMPT_BLOCK, 0, "a try its origin has not started"),
        (1, 0, 0, "a copy re-sent within the held forward's try"),
        (2 * ATTEMPT_BLOCK, 0, ATTEMPT_BLOCK, "a given-up try's token, a new try's attempt"),
        (ATTEMPT_BLOCK, ATTEMPT_BLOCK, 2 * ATTEMPT_BLOCK, "claims a try before the latest"),
        (4 * ATTEMPT_BLOCK, ATTEMPT_BLOCK, ATTEMPT_BLOCK, "a number not handed out"),
        (ATTEMPT_BLOCK, ATTEMPT_BLOCK, None, "the origin does not say (unreachable, ...)"),
    ],
)
def test_another_input_is_declined_unless_the_origin_restarted_since(
    attempt: int, try_start: int, started: int | None, why: str
) -> None:
    made_up = HELD.onward(attempt=attempt, try_start=try_start, path=(ORIGIN, MEMBER))
    words, asked = outcome(made_up, OTHER_INPUT, started)
    assert "its origin has not started it again since" in words, why
    assert asked == 1


def test_a_repair_or_another_origins_forward_from_another_input_is_declined_unasked() -> None:
    repair = HELD.onward(attempt=ATTEMPT_BLOCK, flags=FLAG_REPAIR)
    assert outcome(repair, OTHER_INPUT, ATTEMPT_BLOCK) == (
        "microbatch 7's forward is held here from another input; a repair goes to a relay "
        "that lacks it",
        0,
    )
    # Another data node's forward naming a held id (only a data node breaking its shard does)
    foreign = HELD.onward(attempt=ATTEMPT_BLOCK, origin=OTHER, path=(OTHER, MEMBER))
    words, asked = outcome(foreign, OTHER_INPUT, ATTEMPT_BLOCK)
    assert "not started it again" in words and asked == 0
    words, asked = outcome(foreign.onward(try_start=ATTEMPT_BLOCK), OTHER_INPUT, ATTEMPT_BLOCK)
    assert "not started it again" in words and asked == 0


@pytest.mark.parametrize(("shards", "batch"), [(1, 4), (2, 1), (2, 4), (3, 5)])
def test_data_nodes_of_a_run_never_start_the_same_microbatch_id(shards: int, batch: int) -> None:
    """A relay keys what it holds by (iteration, microbatch), not by origin: that is sound only
    while no two data nodes' ids collide (``held_forward.py``)."""
    owner: dict[int, tuple[int, int]] = {}
    for iteration in range(6):
        for shard in range(shards):
            ids = shard_microbatches(iteration, shard, shards, batch)
            assert len(ids) == batch
            for m in ids:
                assert m not in owner, f"id {m} of {(iteration, shard)} and {owner[m]}"
                owner[m] = (iteration, shard)
    assert sorted(owner) == list(range(6 * shards * batch))  # the whole model's ids, in turn


def test_current_try_requests_are_checked() -> None:
    request = control.CurrentTry(3, 12)
    assert control.decode_request(control.encode_request(request)) == request
    for bad in (
        b'{"type": "current_try", "iteration": 3}',
        b'{"type": "current_try", "iteration": 3, "microbatch": -1}',
        b'{"type": "current_try", "iteration": 3, "microbatch": "12"}',
    ):
        with pytest.raises(ProtocolError):
            control.decode_request(bad)


def test_a_made_up_forward_with_the_last_attempt_number_does_not_lock_out_every_restart() -> None:
    """A run member's made-up forward that reached the relay first, under the highest attempt
    the header can carry: when the origin restarts the microbatch, the restart must replace
    it, or a stage with one replica declines every try of the microbatch for the iteration."""
    top = (1 << 16) - 1  # an attempt no origin hands out
    made_up = HELD.onward(attempt=top, path=(ORIGIN, MEMBER))
    restart = HELD.onward(attempt=ATTEMPT_BLOCK, try_start=ATTEMPT_BLOCK)

    async def main() -> str:
        async def ask_try(origin: str, iteration: int, microbatch: int) -> tuple[int, int]:
            return ATTEMPT_BLOCK, 2 * ATTEMPT_BLOCK  # the origin restarted: its second try

        try:
            await check_second_forward(made_up, OTHER_INPUT, restart, HELD_INPUT, ask_try)
        except Decline as exc:
            return str(exc)
        return "replaced"

    assert trio.run(main) == "replaced"


def test_a_forward_made_up_with_a_given_up_tries_token_never_holds_back_the_new_try() -> None:
    """A node on the path of a try given up (started at 0) keeps its token, and makes up a
    forward with it under an attempt of the new try's block (the attempt is the sender's to
    pick; the token's start is the origin's signature). It must not replace the forward held,
    and once held (it reached the relay first), the new try's own forward must replace it:
    otherwise each such forward costs the microbatch a restart."""
    new_try = HELD.onward(attempt=ATTEMPT_BLOCK, try_start=ATTEMPT_BLOCK)
    made_up = HELD.onward(attempt=ATTEMPT_BLOCK + 44, try_start=0, path=(ORIGIN, MEMBER))

    async def judge(held: HopHeader, header: HopHeader) -> str:
        async def ask_try(origin: str, iteration: int, microbatch: int) -> tuple[int, int]:
            return ATTEMPT_BLOCK, 2 * ATTEMPT_BLOCK  # the origin's second try, in flight

        try:
            await check_second_forward(held, HELD_INPUT, header, OTHER_INPUT, ask_try)
        except Decline as exc:
            return str(exc)
        return "replaced"

    assert "not started it again since" in trio.run(judge, HELD, made_up)
    assert trio.run(judge, made_up, new_try) == "replaced"
