"""The dial-back check: its verdict (pure), its bounds, and real hosts on loopback asking each
other (the NAT cases are in tests/internet/test_reachability_bed.py)."""

from __future__ import annotations

import pytest
import trio
from libp2p.peer.id import ID

from gwtf.errors import ProtocolError
from gwtf.node.p2p.host import full_address, full_addresses, running_host
from gwtf.node.p2p.identity import new_identity
from gwtf.node.p2p.reachability import (
    LIMITS,
    PROTOCOL_ID,
    DialbackRate,
    DialbackService,
    Outcome,
    Reachability,
    ReachabilityCheck,
    ReachabilityMonitor,
    Vote,
    decode_request,
    encode_request,
    verdict,
)
from gwtf.node.p2p.rpc import PeerUnavailable, RequestResponse
from tests.p2p.test_dialing import free_port
from tests.p2p.test_host_stop import run_bounded

R, N, A = Outcome.REACHED, Outcome.NOT_REACHED, Outcome.ABSTAINED


def votes(*outcomes: Outcome, address: str = "/ip4/198.18.0.2/tcp/4001") -> list[Vote]:
    return [
        Vote(f"p{i}", o, address if o is Outcome.REACHED else None) for i, o in enumerate(outcomes)
    ]


def test_the_verdict_is_the_majority_of_the_votes_cast() -> None:
    assert verdict(votes(R, R, N), 7).reachable is True
    assert verdict(votes(R, N, N), 7).reachable is False
    assert verdict(votes(R, N, A), 7).reachable is False  # a tie is not reachable
    assert verdict(votes(R, A, A), 7).reachable is True  # one witness: weak, but unforgeable
    assert verdict(votes(A, A, A), 7).reachable is None
    assert verdict([], 7).reachable is None
    result = verdict(votes(R, R, N), 7)
    assert (result.reached, result.not_reached, result.asked, result.checked_ms) == (2, 1, 3, 7)
    assert result.address == "/ip4/198.18.0.2/tcp/4001" and not result.weak


def test_the_verdict_says_what_it_rests_on() -> None:
    assert verdict(votes(R, R, R), 0).describe() == (
        "reachable at /ip4/198.18.0.2/tcp/4001 (3 of 3 peers dialled it back)"
    )
    assert verdict(votes(N, A), 0).describe() == (
        "behind NAT: running outbound-only (0 of 1 peers dialled it back; only 1 could check)"
    )
    assert verdict(votes(A), 0).describe().startswith("reachability unknown (none of 1 peers")


def test_the_address_most_witnesses_reached_is_named() -> None:
    mixed = [*votes(R, address="/ip4/1.1.1.1/tcp/1"), *votes(R, R, address="/ip4/2.2.2.2/tcp/2")]
    assert verdict(mixed, 0).address == "/ip4/2.2.2.2/tcp/2"


def test_a_request_is_checked_before_anything_is_dialled() -> None:
    me, other = _peer(), _peer()
    mine = f"/ip4/198.18.0.2/tcp/4001/p2p/{me}"
    nonce, addresses = decode_request(encode_request(b"n" * 16, [mine]), str(me))
    assert nonce == b"n" * 16 and addresses == [mine]
    with pytest.raises(ProtocolError, match="names another peer"):
        decode_request(encode_request(b"n" * 16, [f"/ip4/1.2.3.4/tcp/1/p2p/{other}"]), str(me))
    with pytest.raises(ProtocolError, match=r"expected 1\.\.4"):
        decode_request(encode_request(b"n" * 16, [mine] * 5), str(me))
    with pytest.raises(ProtocolError, match="nonce of 3 bytes"):
        decode_request(encode_request(b"abc", [mine]), str(me))
    with pytest.raises(ProtocolError, match="bad dial-back request"):
        decode_request(b"\xff{", str(me))


def test_dial_backs_are_few_at_once_few_a_minute_and_one_per_peer() -> None:
    rate = DialbackRate(per_minute=6.0, burst=3.0, per_peer_s=60.0, at_once=2)
    assert [rate.take(p, 0.0) for p in ("a", "b", "c")] == [None, None, None]
    assert "a minute" in (rate.take("d", 1.0) or "")
    assert "per peer" in (rate.take("a", 30.0) or "")
    assert rate.take("d", 11.0) is None  # 10 s refill one
    rate.running = 1
    assert rate.take("e", 100.0) is None  # a second one while one runs
    rate.running = 2
    assert "busy with 2" in (rate.take("f", 200.0) or "")


def test_a_listening_host_is_reached_and_a_dead_port_is_not() -> None:
    async def main() -> None:
        async with running_host(new_identity()) as witness, running_host(new_identity()) as me:
            DialbackService(RequestResponse(witness), per_address_s=1.0).serve()
            rpc = RequestResponse(me)
            check = ReachabilityCheck(rpc)
            check.serve()
            witness_id = witness.get_id()
            await rpc.dialer.connect(witness_id, witness.get_addrs())
            vote = await check.ask(witness_id, full_addresses(me))
            assert vote.outcome is Outcome.REACHED and vote.address == full_address(me)
            # Asked again at once: one dial-back per peer a minute, so it abstains.
            assert (await check.ask(witness_id, full_addresses(me))).outcome is Outcome.ABSTAINED

        async with running_host(new_identity()) as witness, running_host(new_identity()) as me:
            DialbackService(RequestResponse(witness), per_address_s=1.0).serve()
            rpc = RequestResponse(me)
            check = ReachabilityCheck(rpc)
            check.serve()
            await rpc.dialer.connect(witness.get_id(), witness.get_addrs())
            dead = f"/ip4/127.0.0.1/tcp/{free_port()}/p2p/{me.get_id()}"
            result = await check.check([witness.get_id()], [dead], 5)
            assert (result.reachable, result.not_reached, result.weak) == (False, 1, True)

    run_bounded(main)


def test_a_witness_dials_no_address_the_requester_did_not_claim() -> None:
    """It declines without charging the requester: its copy of the record may be behind."""

    async def main() -> None:
        async with running_host(new_identity()) as witness, running_host(new_identity()) as me:
            served = RequestResponse(witness)
            DialbackService(served).serve()
            rpc = RequestResponse(me)
            await rpc.dialer.connect(witness.get_id(), witness.get_addrs())
            elsewhere = f"/ip4/198.18.7.7/tcp/4001/p2p/{me.get_id()}"
            request = encode_request(b"n" * 16, [elsewhere])
            with pytest.raises(PeerUnavailable, match=r"declined: asked to dial .* not an addr"):
                await rpc.request(witness.get_id(), PROTOCOL_ID, request, LIMITS)
            assert served.scores.score(str(me.get_id()), trio.current_time()) == 0

    run_bounded(main)


def _peer() -> ID:
    return ID.from_pubkey(new_identity().public_key)


def test_the_monitor_checks_at_start_and_again_when_the_addresses_change() -> None:
    """A recheck nobody could answer (the witness allows one per peer a minute) keeps the known
    verdict."""

    async def main() -> None:
        async with running_host(new_identity()) as witness, running_host(new_identity()) as me:
            DialbackService(RequestResponse(witness), per_address_s=1.0).serve()
            rpc = RequestResponse(me)
            check = ReachabilityCheck(rpc)
            check.serve()
            await rpc.dialer.connect(witness.get_id(), witness.get_addrs())
            advertised = full_addresses(me)
            heard: list[Reachability] = []
            monitor = ReachabilityMonitor(
                check,
                lambda: list(advertised),
                lambda: [witness.get_id()],
                heard.append,
                wall_ms=lambda: 42,
                poll_s=0.05,
            )
            async with trio.open_nursery() as nursery:
                nursery.start_soon(monitor.run)
                while not heard:
                    await trio.sleep(0.05)
                assert heard[0].reachable is True and heard[0].checked_ms == 42
                dead = f"/ip4/127.0.0.1/tcp/{free_port()}/p2p/{me.get_id()}"
                advertised.append(dead)
                await trio.sleep(0.5)
                nursery.cancel_scope.cancel()
            assert len(heard) == 1 and monitor.current is heard[0]

    run_bounded(main)
