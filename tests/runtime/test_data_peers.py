"""The data nodes' end-of-iteration messages: checked on the wire, taken only from data nodes."""

from __future__ import annotations

import pytest

from gwtf.errors import ProtocolError
from node.runtime import control
from node.runtime.data_peers import DataPeers


def peers_of(known: set[str]) -> DataPeers:
    # handle() never sends: no host is needed to check what it takes.
    return DataPeers(None, "me", 3, lambda: known, 1.0, 1.0)  # type: ignore[arg-type]


def test_the_messages_round_trip_and_bad_ones_are_refused() -> None:
    for message in (control.BatchDone(4), control.IterationEnded(4, 3)):
        assert control.decode_request(control.encode_request(message)) == message
    for bad in (
        b'{"type": "batch_done"}',
        b'{"type": "iteration_ended", "iteration": 4}',
        b'{"type": "iteration_ended", "iteration": 4, "relays_stepped": "3"}',
        b'{"type": "batch_done", "iteration": -1}',
    ):
        with pytest.raises(ProtocolError):
            control.decode_request(bad)


def test_only_a_data_node_of_the_run_is_heard() -> None:
    peers = peers_of({"other"})
    with pytest.raises(ProtocolError, match="not a data node of this run"):
        peers.handle("relay", control.BatchDone(0))
    assert peers.done == {}
    assert control.decode_reply(peers.handle("other", control.BatchDone(0)))["ok"]
    peers.handle("other", control.IterationEnded(0, 4))
    assert peers.done == {0: {"other"}} and peers.ended == {0: 4}
    assert peers.others() == ["other"]
    peers.gone.add("other")
    assert peers.others() == []
