"""A relay's bandwidth metered per peer: buckets on trio's clock, then real hosts on 127.0.0.1."""

from __future__ import annotations

import time
from contextlib import AsyncExitStack

import pytest
import trio
import trio.testing
from libp2p.abc import INetStream
from libp2p.connection_types import ConnectionType
from libp2p.exceptions import BaseLibp2pError
from libp2p.host.exceptions import StreamFailure
from libp2p.network.connection.raw_connection import RawConnection
from libp2p.network.stream.exceptions import StreamError
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo
from libp2p.relay.circuit_v2.pb.circuit_pb2 import HopMessage
from libp2p.relay.circuit_v2.pb.circuit_pb2 import PeerId as CircuitPeer
from libp2p.relay.circuit_v2.protocol import PROTOCOL_ID as HOP
from libp2p.relay.circuit_v2.protocol_buffer import StatusCode
from libp2p.relay.circuit_v2.utils import write_delimited_msg
from libp2p.stream_muxer.yamux.yamux import YamuxStream

from gwtf.node.p2p import relay_metering
from gwtf.node.p2p.host import full_address, peer_info
from gwtf.node.p2p.relay import (
    RelayRefused,
    circuit_address,
    connect_through,
    read_relay_message,
)
from gwtf.node.p2p.relay_metering import FLOOR_BURST, RelayMeter, TokenBucket
from gwtf.node.p2p.relay_service import LEG_WINDOW, RelayLimits
from gwtf.node.settings import MAX_RELAY_CIRCUITS_PER_PEER
from tests.p2p.test_relay import ECHO, LIMITS, Node, learn, node

SINK = "/gwtf/test-sink/1.0.0"

# ---- the buckets (trio's mock clock: waits are exact) -------------------------------------------


def run_mocked(main: object) -> None:
    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))  # type: ignore[arg-type]


def test_a_bucket_lets_its_burst_through_then_its_rate() -> None:
    async def main() -> None:
        bucket = TokenBucket(rate=1000, burst=500)
        start = trio.current_time()
        assert await bucket.spend(500) == 0.0  # the burst: no wait
        assert await bucket.spend(250) == pytest.approx(0.25)
        assert trio.current_time() - start == pytest.approx(0.25)
        await trio.sleep(10)  # refills to its burst, never past it
        assert bucket.refill() == 500
        assert bucket.full

    run_mocked(main)


def test_concurrent_spenders_never_pass_burst_plus_rate_times_time() -> None:
    async def main() -> None:
        bucket = TokenBucket(rate=1000, burst=500)
        start = trio.current_time()
        paid: list[tuple[float, int]] = []

        async def spender(size: int) -> None:
            for _ in range(20):
                await bucket.spend(size)
                paid.append((trio.current_time() - start, size))

        async with trio.open_nursery() as nursery:
            for size in (100, 300, 700):
                nursery.start_soon(spender, size)
        total = 0
        for at, size in sorted(paid):
            total += size
            assert total <= 500 + 1000 * at + 1e-6, (at, total)
        assert trio.current_time() - start == pytest.approx((20 * 1100 - 500) / 1000)

    run_mocked(main)


def test_bytes_are_charged_to_their_sender_only() -> None:
    async def main() -> None:
        meter = RelayMeter(rate=1000, burst=500)
        await meter.charge("pusher", "quiet", 2500)  # 2000 over: 2 s
        meter.delivered("quiet", 2500)
        await meter.charge("quiet", "pusher", 400)
        meter.delivered("pusher", 400)
        view = meter.view()
        counts = ("sent", "received", "throttled_s")
        assert [view["pusher"][c] for c in counts] == [2500, 400, 2.0]
        assert [view["quiet"][c] for c in counts] == [400, 2500, 0.0]

    run_mocked(main)


def test_idle_peers_are_forgotten_beyond_the_cap_busy_ones_kept(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(relay_metering, "MAX_PEERS_KEPT", 3)

    async def main() -> None:
        meter = RelayMeter(rate=1000, burst=500)
        meter.of("busy").circuits = 1
        meter.of("idle")
        await trio.sleep(1)
        await meter.charge("spent", "busy", 500)  # its bucket is empty: not forgotten yet
        await trio.sleep(0.1)
        meter.of("new")  # forgets the least recent idle peer
        assert set(meter.peers) == {"busy", "spent", "new"}
        await trio.sleep(1)  # "spent" refilled: forgetting it now grants it nothing
        meter.of("newer")
        assert set(meter.peers) == {"busy", "new", "newer"}

    run_mocked(main)


def test_each_circuit_end_keeps_its_floor_while_its_peers_bucket_is_empty() -> None:
    """Eight busy ends split a rate of 100 kB/s: 12.5 kB/s each without the floor; with it,
    each moves at least its 50 kB/s, and all together at most the bucket's bound plus theirs."""
    rate, floor, ends, seconds, chunk = 100_000, 50_000, 8, 20.0, 16 * 1024

    async def main() -> None:
        meter = RelayMeter(rate=rate, burst=FLOOR_BURST, floor=floor)
        start = trio.current_time()
        moved = [0] * ends

        async def end(i: int) -> None:
            own = meter.end_floor()
            with trio.move_on_after(seconds):
                while True:
                    await meter.charge("busy", "other", chunk, own)
                    moved[i] += chunk

        async with trio.open_nursery() as nursery:
            for i in range(ends):
                nursery.start_soon(end, i)
        elapsed = trio.current_time() - start
        assert min(moved) >= floor * elapsed - chunk, moved
        most = FLOOR_BURST + rate * elapsed + ends * floor * elapsed
        assert sum(moved) <= most, (sum(moved), most)
        assert meter.view()["busy"]["floored"] > 0

    run_mocked(main)


def test_a_meter_without_a_floor_gives_no_end_one() -> None:
    async def main() -> None:
        assert RelayMeter(rate=1, burst=1).end_floor() is None
        floor = RelayMeter(rate=1, burst=1, floor=5).end_floor()
        assert floor is not None and (floor.rate, floor.burst) == (5, FLOOR_BURST)
        assert floor.tokens == 0  # earned while the end lives, never handed out

    run_mocked(main)


def test_a_meter_needs_a_positive_rate_and_burst() -> None:
    with pytest.raises(ValueError, match="must be positive"):
        RelayLimits(peer_bytes_per_s=0)
    with pytest.raises(ValueError, match="must be positive"):
        RelayMeter(rate=1, burst=0)
    with pytest.raises(ValueError, match="must be positive"):
        RelayLimits(circuit_floor_bytes_per_s=0)
    with pytest.raises(ValueError, match="must not be negative"):
        RelayMeter(rate=1, burst=1, floor=-1)


def test_the_settings_circuit_cap_fits_the_relays_hop_streams_per_peer() -> None:
    # Each circuit holds a hop stream: a larger cap would never be reached.
    assert RelayLimits().hop_streams_per_peer >= MAX_RELAY_CIRCUITS_PER_PEER + 2


# ---- real hosts through one relay ---------------------------------------------------------------

RATE = 200_000
BURST = 64 * 1024
FLOOR = RelayLimits().circuit_floor_bytes_per_s
#: Frames and handshakes that were counted as sent but are not the payload counted here.
SLACK = 64 * 1024


class Sink:
    """Counts the bytes each peer sends on ``SINK`` streams to a host."""

    def __init__(self, target: Node) -> None:
        self.got: dict[ID, int] = {}
        target.host.set_stream_handler(SINK, self.handle)

    async def handle(self, stream: INetStream) -> None:
        peer = stream.muxed_conn.peer_id
        try:
            while data := await stream.read(64 * 1024):
                self.got[peer] = self.got.get(peer, 0) + len(data)
        except Exception:  # reset when the pusher stops: the count is what arrived
            pass


async def push(source: Node, target: ID, total: int | None, seconds: float) -> None:
    """Write to ``target`` as fast as the circuit takes it, ``total`` bytes or for ``seconds``."""
    stream = await source.host.new_stream(target, [SINK])
    sent = 0
    with trio.move_on_after(seconds):
        while total is None or sent < total:
            size = 32 * 1024 if total is None else min(32 * 1024, total - sent)
            await stream.write(b"x" * size)
            sent += size
    with trio.move_on_after(2):
        await stream.close()


def test_a_peer_pushing_hard_is_held_to_its_rate_and_others_keep_their_share() -> None:
    limits = RelayLimits(peer_bytes_per_s=RATE, peer_burst_bytes=BURST)

    async def main() -> None:
        async with AsyncExitStack() as stack:
            relay = await stack.enter_async_context(node(stack, serve=True, limits=limits))
            relayed = (full_address(relay.host),)
            home_a = await stack.enter_async_context(node(stack, relays=relayed))
            home_b = await stack.enter_async_context(node(stack, relays=relayed))
            a = await stack.enter_async_context(node(stack, trusts=[relay]))
            b = await stack.enter_async_context(node(stack, trusts=[relay]))
            for peer, home in ((a, home_a), (b, home_b)):
                circuit = f"{full_address(relay.host)}/p2p-circuit/p2p/{home.host.get_id()}"
                learn(peer, home.host, [circuit])
                with trio.fail_after(10):
                    assert await peer.rpc.request(home.host.get_id(), ECHO, b"hi", LIMITS)
            sink_a, sink_b, sink_at_b = Sink(home_a), Sink(home_b), Sink(b)
            a_id, b_id = a.host.get_id(), b.host.get_id()
            home_b_id = home_b.host.get_id()
            quiet = 40_000  # under B's burst: B's own bytes never wait
            quiet_done: list[float] = []

            async def b_sends() -> None:
                await push(b, home_b_id, quiet, 30)
                while sink_b.got.get(b_id, 0) < quiet:
                    await trio.sleep(0.05)
                quiet_done.append(trio.current_time())

            # A pushes to its home for 6 s (longer than py-libp2p's 5 s window wait: slowed,
            # not cut), B's home pushes down B's own circuit, and B sends a little meanwhile.
            start = trio.current_time()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(push, a, home_a.host.get_id(), None, 6.0)
                nursery.start_soon(push, home_b, b_id, None, 6.0)
                nursery.start_soon(b_sends)
            elapsed = trio.current_time() - start
            bound = RATE * elapsed + BURST + SLACK + FLOOR * elapsed
            # Each pusher got no more than its rate and its one end's floor (unmetered,
            # loopback moves megabytes a second); the relay counts what it forwarded, and
            # slowed only the pushers.
            assert 0 < sink_a.got[a_id] <= bound, (sink_a.got, elapsed)
            assert 0 < sink_at_b.got[home_b_id] <= bound, (sink_at_b.got, elapsed)
            view = relay.relay.hop.meter.view() if relay.relay.hop else {}
            pushed, by_home = view[str(a_id)], view[str(home_b_id)]
            assert pushed["sent"] >= sink_a.got[a_id] and pushed["throttled_s"] > 0
            assert by_home["sent"] >= sink_at_b.got[home_b_id] and by_home["throttled_s"] > 0
            assert view[str(home_a.host.get_id())]["received"] >= sink_a.got[a_id]
            # B's bytes went through at once: what others push does not spend B's budget.
            assert view[str(b_id)]["throttled_s"] == 0
            assert quiet_done and quiet_done[0] - start < 20, quiet_done
            assert view[str(a_id)]["circuits"] == 1  # A's circuit is still open, not cut

    trio.run(main)


def test_a_peer_over_its_circuit_cap_is_refused_until_one_ends() -> None:
    limits = RelayLimits(circuits_per_peer=1)

    async def main() -> None:
        async with AsyncExitStack() as stack:
            relay = await stack.enter_async_context(node(stack, serve=True, limits=limits))
            relayed = (full_address(relay.host),)
            first = await stack.enter_async_context(node(stack, relays=relayed))
            second = await stack.enter_async_context(node(stack, relays=relayed))
            peer = await stack.enter_async_context(node(stack, trusts=[relay]))
            info = peer_info(full_address(relay.host))
            first_id, second_id = first.host.get_id(), second.host.get_id()
            await connect_through(peer.host, info, first_id, 5.0)
            with pytest.raises(RelayRefused) as refused:
                await connect_through(peer.host, info, second_id, 5.0)
            assert StatusCode(refused.value.status) == StatusCode.RESOURCE_LIMIT_EXCEEDED
            guard = relay.relay.hop
            assert guard is not None and guard.refused == 1
            assert guard.meter.view()[str(peer.host.get_id())]["circuits"] == 1
            await peer.host.get_network().close_peer(first_id)  # its circuit ends
            with trio.fail_after(10):
                while guard.meter.view()[str(peer.host.get_id())]["circuits"]:
                    await trio.sleep(0.05)
            await connect_through(peer.host, info, second_id, 5.0)

    trio.run(main)


def test_a_peer_sending_past_its_window_is_cut_off_before_the_relay_buffers_much() -> None:
    """py-libp2p's yamux buffers whatever a peer sends past its receive window: a peer that
    ignores the window would pile bytes up at a relay reading its leg slowly (metered). The
    host's muxer (``yamux_window``) cuts it off."""
    limits = RelayLimits(peer_bytes_per_s=RATE, peer_burst_bytes=BURST)

    async def main() -> None:
        async with AsyncExitStack() as stack:
            relay = await stack.enter_async_context(node(stack, serve=True, limits=limits))
            relayed = (full_address(relay.host),)
            home = await stack.enter_async_context(node(stack, relays=relayed))
            flooder = await stack.enter_async_context(node(stack, trusts=[relay]))
            Sink(home)
            home_id, flooder_id = home.host.get_id(), flooder.host.get_id()
            info = peer_info(full_address(relay.host))
            leg = await _circuit_leg(flooder, info, home_id)
            stream = await flooder.host.new_stream(home_id, [SINK])
            for muxed in (leg.muxed_stream, stream.muxed_stream):  # ignore flow control
                muxed.send_window = 1 << 40  # type: ignore[attr-defined]
            [conn] = relay.host.get_network().connections[flooder_id]
            buffers = conn.muxed_conn.stream_buffers  # type: ignore[attr-defined]
            most = 0

            async def watch() -> None:
                nonlocal most
                while True:
                    most = max(most, sum(len(b) for b in buffers.values()))
                    await trio.sleep(0.005)

            sent = 0
            async with trio.open_nursery() as nursery:
                nursery.start_soon(watch)
                with trio.move_on_after(30), pytest.raises(Exception):  # noqa: B017 reset/closed
                    while sent < 256 << 20:
                        await stream.write(b"x" * (1 << 20))
                        sent += 1 << 20
                nursery.cancel_scope.cancel()
            # Cut off within a few window's worth of bytes (unmetered, it piles up hundreds of
            # MiB), and the relay closed the flooder's connection, which frees what it buffered.
            assert sent < 64 << 20, sent
            # What a leg may hold: its window, and the one write (1 MiB) that overflowed it.
            assert most <= LEG_WINDOW + (1 << 20) + SLACK, most
            with trio.fail_after(5):
                await conn.muxed_conn.event_closed.wait()  # type: ignore[attr-defined]
            assert not buffers
            assert conn.muxed_conn.violated  # type: ignore[attr-defined]  # the muxer's guard

    trio.run(main)


async def _circuit_leg(source: Node, relay: PeerInfo, target: ID) -> INetStream:
    """``connect_through``, keeping the circuit's stream (its leg at the relay) at hand."""
    await source.host.connect(relay)
    leg = await source.host.new_stream(relay.peer_id, [HOP])
    request = HopMessage(type=HopMessage.CONNECT, peer=CircuitPeer(id=target.to_bytes()))
    await write_delimited_msg(leg, request)
    answer = await read_relay_message(leg, HopMessage, 5.0)
    assert answer is not None and StatusCode(answer.status) == StatusCode.OK
    where = circuit_address(relay.addrs[0].encapsulate(f"/p2p/{relay.peer_id}"), target)
    raw = RawConnection(leg, initiator=True, connection_type=ConnectionType.RELAYED,
                        addresses=[where])  # fmt: skip
    await source.host.upgrade_outbound_connection(raw, target)
    return leg


def test_a_peer_pushing_over_its_rate_still_gets_a_new_circuit() -> None:
    """The floor keeps every circuit alive, so no circuit is refused to protect the others
    (a refusal would let counterparts deny a peer new circuits by keeping it busy)."""
    limits = RelayLimits(peer_bytes_per_s=RATE, peer_burst_bytes=BURST)

    async def main() -> None:
        async with AsyncExitStack() as stack:
            relay = await stack.enter_async_context(node(stack, serve=True, limits=limits))
            relayed = (full_address(relay.host),)
            first = await stack.enter_async_context(node(stack, relays=relayed))
            second = await stack.enter_async_context(node(stack, relays=relayed))
            peer = await stack.enter_async_context(node(stack, trusts=[relay]))
            Sink(first)
            info = peer_info(full_address(relay.host))
            await connect_through(peer.host, info, first.host.get_id(), 5.0)
            guard = relay.relay.hop
            assert guard is not None
            async with trio.open_nursery() as nursery:
                nursery.start_soon(push, peer, first.host.get_id(), None, 3.0)
                await trio.sleep(1.5)  # over its rate by now: its bucket is empty
                assert not guard.meter.peers[str(peer.host.get_id())].bucket.full
                await connect_through(peer.host, info, second.host.get_id(), 5.0)
            assert guard.refused == 0

    trio.run(main)


async def both_ways(a: Node, others: list[Node], seconds: float) -> list[str]:
    """Write from ``a`` to each of ``others`` and back for ``seconds``; the streams that broke."""
    broken: list[str] = []

    async def write(src: Node, dst: ID, name: str) -> None:
        try:
            stream = await src.host.new_stream(dst, [SINK])
            with trio.move_on_after(seconds):
                while True:
                    await stream.write(b"x" * (32 * 1024))
            with trio.move_on_after(2):
                await stream.reset()
        except Exception as exc:  # reset: the circuit broke under the metering
            broken.append(f"{name}: {type(exc).__name__} {exc}")

    async with trio.open_nursery() as nursery:
        for i, other in enumerate(others):
            nursery.start_soon(write, a, other.host.get_id(), f"a->{i}")
            nursery.start_soon(write, other, a.host.get_id(), f"{i}->a")
    return broken


def test_circuits_busy_both_ways_over_one_thin_rate_slow_down_but_never_break() -> None:
    """Three circuits busy both ways split a rate of 64 KiB/s: about 22 KiB/s an end, too thin
    for their flow-control updates (behind the bytes the relay holds back, py-libp2p's yamux
    waits 5 s for a window and resets); each end's floor keeps them moving."""
    limits = RelayLimits(peer_bytes_per_s=64 * 1024, peer_burst_bytes=BURST)

    async def main() -> None:
        async with AsyncExitStack() as stack:
            relay = await stack.enter_async_context(node(stack, serve=True, limits=limits))
            relayed = (full_address(relay.host),)
            a = await stack.enter_async_context(node(stack, relays=relayed))
            others = [await stack.enter_async_context(node(stack, relays=relayed))
                      for _ in range(3)]  # fmt: skip
            info = peer_info(full_address(relay.host))
            for n in (a, *others):
                Sink(n)
            for other in others:
                await connect_through(a.host, info, other.host.get_id(), 5.0)
            assert await both_ways(a, others, 8.0) == []
            guard = relay.relay.hop
            assert guard is not None
            view = guard.meter.view()[str(a.host.get_id())]
            assert view["floored"] > 0 and view["circuits"] == 3

    trio.run(main)


def test_a_peer_gets_no_more_than_its_rate_and_its_ends_floors() -> None:
    """A peer with as many circuit ends as the relay lets it have (2 it opened, 2 opened to it)
    pushing on all of them gets at most its rate plus 4 floors; a fifth end is refused."""
    limits = RelayLimits(
        peer_bytes_per_s=RATE, peer_burst_bytes=BURST, circuits_per_peer=2,
        circuits_per_destination=2,
    )  # fmt: skip
    seconds = 5.0

    async def main() -> None:
        async with AsyncExitStack() as stack:
            relay = await stack.enter_async_context(node(stack, serve=True, limits=limits))
            relayed = (full_address(relay.host),)
            greedy = await stack.enter_async_context(node(stack, relays=relayed))
            others = [await stack.enter_async_context(node(stack, relays=relayed))
                      for _ in range(5)]  # fmt: skip
            info = peer_info(full_address(relay.host))
            sinks = [Sink(n) for n in others]
            greedy_id = greedy.host.get_id()
            for other in others[:2]:
                await connect_through(greedy.host, info, other.host.get_id(), 5.0)
            for other in others[2:4]:
                await connect_through(other.host, info, greedy_id, 5.0)
            with pytest.raises(RelayRefused):  # its cap: 2 circuits opened
                await connect_through(greedy.host, info, others[4].host.get_id(), 5.0)
            with pytest.raises(RelayRefused):  # its slot's cap: 2 circuits to it
                await connect_through(others[4].host, info, greedy_id, 5.0)
            start = trio.current_time()
            async with trio.open_nursery() as nursery:
                for other in others[:4]:
                    nursery.start_soon(push, greedy, other.host.get_id(), None, seconds)
            elapsed = trio.current_time() - start
            got = sum(sink.got.get(greedy_id, 0) for sink in sinks)
            ends = limits.ends_per_peer
            most = BURST + RATE * elapsed + ends * FLOOR * elapsed + ends * SLACK
            assert got <= most, (got, most)
            # More than its rate alone: the floors did forward (not a bound met by accident).
            assert got > BURST + RATE * elapsed + SLACK, got

    trio.run(main)


def test_a_peer_churning_circuits_gets_no_more_than_its_rate_and_its_open_ends_floors() -> None:
    """Eight loops open a circuit, write one floor's worth and reset, as fast as the relay
    takes CONNECTs: a new end's floor starts empty, so the peer gets at most its rate plus
    eight ends' floors over the time (a floor handed out full paid 64 KiB a circuit)."""
    limits = RelayLimits(peer_bytes_per_s=RATE, peer_burst_bytes=BURST)
    seconds, loops = 4.0, 8

    async def main() -> None:
        async with AsyncExitStack() as stack:
            relay = await stack.enter_async_context(node(stack, serve=True, limits=limits))
            relayed = (full_address(relay.host),)
            greedy = await stack.enter_async_context(node(stack, relays=relayed))
            target = await stack.enter_async_context(node(stack, relays=relayed))
            info = peer_info(full_address(relay.host))
            await greedy.host.connect(info)
            connect = HopMessage(type=HopMessage.CONNECT,
                                 peer=CircuitPeer(id=target.host.get_id().to_bytes()))  # fmt: skip
            opened = [0]

            async def churn() -> None:
                while True:
                    try:
                        leg = await greedy.host.new_stream(info.peer_id, [HOP])
                    except StreamFailure:
                        # The relay's cap on live streams a connection holds (the handlers of
                        # circuits just reset still run) refuses some: churning goes on.
                        await trio.sleep(0.02)
                        continue
                    try:
                        await write_delimited_msg(leg, connect)
                        answer = await read_relay_message(leg, HopMessage, 5.0)
                        if answer is not None and StatusCode(answer.status) == StatusCode.OK:
                            opened[0] += 1
                            await leg.write(b"x" * FLOOR_BURST)
                            await trio.sleep(0.02)
                    except (StreamError, BaseLibp2pError):  # the relay reset it first
                        pass
                    await leg.reset()

            start = trio.current_time()
            with trio.move_on_after(seconds):
                async with trio.open_nursery() as nursery:
                    for _ in range(loops):
                        nursery.start_soon(churn)
            elapsed = trio.current_time() - start
            sent = relay.relay.hop.meter.peers[str(greedy.host.get_id())].sent
            assert opened[0] > loops  # circuits did churn
            assert sent <= BURST + RATE * elapsed + loops * FLOOR * elapsed, (sent, opened)

    trio.run(main)


def test_a_lapsed_slot_taken_anew_keeps_counting_the_circuits_open_to_it() -> None:
    """py-libp2p makes a new reservation (its circuit count at 0) when a lapsed slot is
    reserved again; the relay's own count per peer still refuses circuits past the cap."""
    limits = RelayLimits(circuits_per_destination=2)

    async def main() -> None:
        async with AsyncExitStack() as stack:
            relay = await stack.enter_async_context(node(stack, serve=True, limits=limits))
            relayed = (full_address(relay.host),)
            target = await stack.enter_async_context(node(stack, relays=relayed))
            others = [await stack.enter_async_context(node(stack, relays=relayed))
                      for _ in range(3)]  # fmt: skip
            info = peer_info(full_address(relay.host))
            target_id = target.host.get_id()
            for other in others[:2]:
                await connect_through(other.host, info, target_id, 5.0)
            book = relay.relay.protocol.resource_manager
            book._reservations[target_id].expires_at = time.time() - 1  # the 10 min passed
            book.reserve(target_id)  # what the relay does for the peer's next RESERVE
            with pytest.raises(RelayRefused):
                await connect_through(others[2].host, info, target_id, 5.0)
            assert relay.relay.hop.meter.peers[str(target_id)].circuits_to == 2

    trio.run(main)


def test_a_relays_legs_keep_their_initial_window_over_a_long_round_trip(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With a 50 ms round trip (yamux's autotune reads the ping's), a busy circuit's legs
    would grow their windows to MiBs at the relay; a leg's window stays ``LEG_WINDOW``."""
    monkeypatch.setattr(YamuxStream, "_effective_rtt", lambda self: 0.05)
    limits = RelayLimits()  # the default 16 MiB burst: nothing slows the pusher

    async def main() -> None:
        async with AsyncExitStack() as stack:
            relay = await stack.enter_async_context(node(stack, serve=True, limits=limits))
            relayed = (full_address(relay.host),)
            home = await stack.enter_async_context(node(stack, relays=relayed))
            pusher = await stack.enter_async_context(node(stack, trusts=[relay]))
            home_id = home.host.get_id()
            circuit = f"{full_address(relay.host)}/p2p-circuit/p2p/{home_id}"
            learn(pusher, home.host, [circuit])
            with trio.fail_after(10):
                assert await pusher.rpc.request(home_id, ECHO, b"hi", LIMITS)
            sink, largest = Sink(home), [0]

            async def watch() -> None:
                while True:
                    for conns in relay.host.get_network().connections.values():
                        for conn in conns:
                            for leg in getattr(conn.muxed_conn, "streams", {}).values():
                                largest[0] = max(largest[0], leg.target_recv_window)
                    await trio.sleep(0.05)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(watch)
                await push(pusher, home_id, None, 3.0)
                nursery.cancel_scope.cancel()
            assert sink.got[pusher.host.get_id()] > 4 * LEG_WINDOW  # the circuit was busy
            assert largest[0] == LEG_WINDOW, largest

    trio.run(main)
