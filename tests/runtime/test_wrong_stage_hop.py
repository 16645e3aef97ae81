"""A hop for a stage the relay does not serve (its sender has not heard that it moved) is
declined as misdirected: its sender is not charged, and forgets the relay there."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from gwtf.node.p2p.rpc import NotHere
from gwtf.node.runtime.dataplane.hop import FORWARD, HopHeader
from gwtf.node.training import codec
from tests.runtime.test_kept_forward_overwrite import (
    LIMITS,
    PEER,
    relay_r,
    swarm_of,
    tensor,
    tried,
)


def test_a_hop_for_another_stage_is_declined_as_not_here(tmp_path: Path) -> None:
    books, _capture, plane_r, planes = swarm_of(tmp_path)
    frame = codec.encode(7, tensor(1), LIMITS)
    for_stage_2 = tried(HopHeader(1, 0, 7, 0, FORWARD, 2, 0, 0, PEER["d"], (PEER["d"], PEER["s"])))

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            relay_r(nursery, books, plane_r, planes)  # a stage-1 relay
            plane_r.serve(nursery)
            with pytest.raises(NotHere, match="hop for stage 2 sent to a stage 1 relay"):
                await planes["s"].send(PEER["r"], for_stage_2, frame)
            nursery.cancel_scope.cancel()

    trio.run(main)
