"""The data nodes' messages: checked on the wire, taken only from data nodes; shards compared."""

from __future__ import annotations

from contextlib import AsyncExitStack
from pathlib import Path

import pytest
import trio
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.peer.id import ID

from gwtf.errors import ProtocolError, TrainingError
from gwtf.node.p2p.host import full_address, peer_info, running_host
from gwtf.node.p2p.identity import new_identity
from gwtf.node.p2p.rpc import Decline, PeerUnavailable, RequestResponse, RpcLimits
from gwtf.node.runtime.dataplane import control
from gwtf.node.runtime.roles.data_peers import DataPeers, LeftOut

LIMITS = RpcLimits(control.MAX_BYTES, control.MAX_BYTES, 5.0)


def peers_of(known: set[str]) -> DataPeers:
    # handle() never sends: no host is needed to check what it takes.
    return DataPeers(None, "me", 3, 1, lambda: known, 1.0, 1.0)  # type: ignore[arg-type]


def test_the_messages_round_trip_and_bad_ones_are_refused() -> None:
    for message in (
        control.Shard(),
        control.BatchDone(4),
        control.IterationEnded(4, 3, ("a", "b")),
    ):
        assert control.decode_request(control.encode_request(message)) == message
    for bad in (
        b'{"type": "batch_done"}',
        b'{"type": "iteration_ended", "iteration": 4}',
        b'{"type": "iteration_ended", "iteration": 4, "relays_stepped": "3", "members": []}',
        b'{"type": "iteration_ended", "iteration": 4, "relays_stepped": 3, "members": [3]}',
        b'{"type": "batch_done", "iteration": -1}',
    ):
        with pytest.raises(ProtocolError):
            control.decode_request(bad)


def test_only_a_data_node_of_the_run_is_heard_and_only_about_the_iterations_at_hand() -> None:
    peers = peers_of({"other"})
    with pytest.raises(Decline, match="not known here as a data node"):
        peers.handle("relay", control.BatchDone(0))
    assert peers.done == {}
    assert control.decode_reply(peers.handle("other", control.Shard())) == {
        "ok": True,
        "shard": 1,
        "shards": 3,
        "left_out": False,
    }
    peers.iteration = 5
    assert control.decode_reply(peers.handle("other", control.BatchDone(5)))["ok"]
    peers.handle("other", control.IterationEnded(5, 4, ("me", "other")))
    peers.handle("other", control.BatchDone(6))  # one ahead: it may have finished its share
    peers.handle("other", control.BatchDone(3))  # late: over, and forgotten
    with pytest.raises(ProtocolError, match="speaks of iteration 7"):
        peers.handle("other", control.BatchDone(7))
    assert peers.done == {5: {"other"}, 6: {"other"}} and peers.ended == {5: 4}
    assert peers.next_members == {5: ("me", "other")}
    # Only a peer that answered with a shard of its own is waited for.
    assert peers.others() == []
    peers.members["other"] = 2
    assert peers.others() == ["other"]
    peers.gone.add("other")
    assert peers.others() == []


def test_a_data_node_hears_that_it_was_left_out_only_from_a_member() -> None:
    """An iteration's end that does not name this data node, from a data node of the run,
    means it was left out: it then asks back in. Anyone else saying so changes nothing; and a
    data node tells one it counts as gone so when asked (``Shard``)."""
    peers = peers_of({"other", "stranger"})
    peers.members["other"] = 2
    peers.iteration = 5
    peers.handle("stranger", control.IterationEnded(5, 4, ("other",)))
    assert peers.left_out_at is None
    peers.handle("other", control.IterationEnded(5, 4, ("me", "other")))
    assert peers.left_out_at is None and peers.ended == {5: 4}
    peers.handle("other", control.IterationEnded(3, 4, ("other",)))  # older than the last one
    assert peers.left_out_at is None
    peers.handle("other", control.IterationEnded(4, 4, ("other",)))  # late, but still telling
    assert peers.left_out_at == 4

    async def check_in() -> None:
        with pytest.raises(LeftOut, match="left out of iteration 4"):
            await peers.check_in(5)

    trio.run(check_in)
    peers.gone.add("other")
    assert control.decode_reply(peers.handle("other", control.Shard()))["left_out"] is True


def test_data_nodes_starting_one_shard_or_counting_differently_are_refused(
    tmp_path: Path,
) -> None:
    """Two data nodes on real hosts compare shards before training: the same shard twice, or a
    different count of data nodes, is a one-line error saying which setting to fix."""

    async def main() -> None:
        async with AsyncExitStack() as stack:
            hosts = [
                await stack.enter_async_context(running_host(new_identity())) for i in range(2)
            ]
            ids = [str(host.get_id()) for host in hosts]
            rpcs = [RequestResponse(host) for host in hosts]
            peers = [
                DataPeers(rpcs[i], ids[i], 2, 0, lambda i=i: {ids[1 - i]}, 2.0, 2.0)  # type: ignore[misc]
                for i in range(2)
            ]
            for rpc, data_peers in zip(rpcs, peers, strict=True):

                async def handle(peer: str, request: bytes, mine: DataPeers = data_peers) -> bytes:
                    message = control.decode_request(request)
                    assert isinstance(message, control.Shard)
                    return mine.handle(peer, message)

                rpc.serve(control.PROTOCOL_ID, handle, LIMITS)
            await hosts[0].connect(peer_info(full_address(hosts[1])))
            with trio.fail_after(20):
                with pytest.raises(TrainingError, match="both start shard 0") as info:
                    await peers[0].wait_for_all(10.0)
                assert "training.data_shard" in str(info.value)
                peers[1].expected = 3
                with pytest.raises(TrainingError, match="counts 3 data nodes, this one 2"):
                    await peers[0].wait_for_all(10.0)
                peers[1].expected, peers[1].shard = 2, 1
                await peers[0].wait_for_all(10.0)
                assert peers[0].members == {ids[1]: 1}
                # Checking in: counted, then left out by the other; one that never answers is
                # asked once per iteration.
                dead = str(ID.from_pubkey(new_identity().public_key))
                peers[0].members[dead] = 0
                peers[1].members[ids[0]] = 0
                await peers[0].check_in(3)
                assert peers[0].silent == {3: {dead}}
                peers[1].gone.add(ids[0])
                with pytest.raises(LeftOut, match="left out of iteration 3"):
                    await peers[0].check_in(3)
                assert peers[0].left_out_at is None  # heard when asked, not told

    trio.run(main)


def test_a_data_node_asking_back_in_ends_the_wait_for_its_lost_share() -> None:
    """A member that restarted asks to be taken back: its old process's share of the iteration
    at hand is lost, so it is gone for now and waits to be named in the next membership."""
    peers = peers_of({"other"})
    peers.members["other"] = 2
    peers.handle("other", control.Rejoin())
    assert peers.others() == [] and peers.pending == {"other"}
    peers._adopt(("me", "other"))
    assert peers.others() == ["other"] and peers.pending == set()
    peers._adopt(("me",))  # the one ending an iteration left it out
    assert peers.others() == []


def test_a_joiner_starts_after_the_iteration_whose_end_names_it() -> None:
    peers = peers_of({"other"})
    peers.joining = True
    peers.handle("other", control.IterationEnded(7, 2, ("other",)))  # not yet named
    assert peers.start_at is None
    peers.handle("other", control.IterationEnded(8, 2, ("me", "other")))
    assert peers.start_at == 9 and peers.others() == ["other"]


class ShardAfterSilence:
    """A control channel on which the first ``silent`` asks fail as a refused dial would, and
    then the peer answers as a data node of shard 2 of 3."""

    def __init__(self, silent: int) -> None:
        self.silent = silent
        self.dropped: list[str] = []

    async def request(self, peer: ID, protocol: str, payload: bytes, limits: object) -> bytes:
        if self.silent:
            self.silent -= 1
            raise PeerUnavailable(f"peer {peer} recently failed all addresses")
        return control.encode_reply(True, shard=2, shards=3, left_out=False)

    async def drop_peer(self, peer: ID) -> None:
        self.dropped.append(str(peer))


def restarted_member(rpc: ShardAfterSilence) -> tuple[DataPeers, str]:
    other = str(ID.from_pubkey(create_new_key_pair().public_key))
    peers = DataPeers(rpc, "me", 3, 1, lambda: {other}, 1.0, 1.0)  # type: ignore[arg-type]
    peers.members[other] = 2
    peers.handle(other, control.Rejoin())  # it restarted and asks back in
    return peers, other


def test_a_data_node_asking_back_in_is_asked_again_when_its_first_answer_does_not_come() -> None:
    rpc = ShardAfterSilence(silent=1)
    peers, other = restarted_member(rpc)
    trio.run(peers.announce_ended, 5, 2, ["me"])
    assert rpc.dropped == [other]  # what was open to its old process is closed first
    assert peers.pending == {other} and peers.others() == []  # asked again at the next end
    trio.run(peers.announce_ended, 6, 2, ["me"])
    assert peers.others() == [other] and peers.members[other] == 2 and not peers.pending


def test_a_data_node_that_never_answers_is_given_up_after_a_few_iteration_ends() -> None:
    peers, other = restarted_member(ShardAfterSilence(silent=10))
    for iteration in range(3):
        assert other in peers.pending
        trio.run(peers.announce_ended, iteration, 2, ["me"])
    assert not peers.pending and peers.others() == [] and not peers.admit_tries
