"""Discovery on real libp2p hosts on 127.0.0.1: the Kademlia DHT, and hints over gossipsub."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import trio
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.crypto.keys import KeyPair
from libp2p.kad_dht.kad_dht import DHTMode, KadDHT
from libp2p.peer.id import ID
from libp2p.tools.anyio_service import background_trio_service

from gwtf.node.p2p.discovery_records import (
    PeerCard,
    card_key,
    encode_hint,
    hint_topic,
    run_key,
    sign_card,
)
from gwtf.node.p2p.hints import HintChannel
from gwtf.node.p2p.host import full_address, peer_info, running_host
from gwtf.node.p2p.rpc import Admission, RequestResponse
from gwtf.node.p2p.scoring import Offence
from gwtf.node.runtime.discovery.address_book import AddressBook, own_record
from gwtf.node.runtime.discovery.run_discovery import DiscoverySettings, RunDiscovery


@asynccontextmanager
async def discovery_node(
    run_id: int,
    stage: int,
    bootstrap: tuple[str, ...] = (),
    *,
    keys: KeyPair | None = None,
    admit: Admission | None = None,
    wall_offset_ms: int = 0,
    **settings: Any,
) -> AsyncIterator[RunDiscovery]:
    """A host running discovery only; it serves no peer exchange, so all it learns is DHT/hint."""
    keys = keys or create_new_key_pair()
    async with running_host(keys) as host, trio.open_nursery() as nursery:
        rpc = RequestResponse(host) if admit is None else RequestResponse(host, admit=admit)
        book = AddressBook(rpc, own_record(rpc, "oregon"), on_new_peer=lambda _record: None)
        role = "data" if stage == 0 else "relay"
        chosen = {"period_s": 1.0, "exchange_fallback": False} | settings
        config = DiscoverySettings(run_id, stage, role, bootstrap, **chosen)
        discovery = RunDiscovery(
            book,
            keys.private_key,
            config,
            spare_of=lambda: 2,
            wall_ms=lambda: int(time.time() * 1000) + wall_offset_ms,
        )
        nursery.start_soon(discovery.run)
        await discovery.ready.wait()
        yield discovery
        nursery.cancel_scope.cancel()


async def eventually(check: Callable[[], bool], what: str, timeout_s: float = 15.0) -> None:
    with trio.fail_after(timeout_s):
        while not check():
            await trio.sleep(0.1)
    assert check(), what


def peer_id(node: RunDiscovery) -> str:
    return node.book.own.peer_id


async def start_all(
    stack: AsyncExitStack, specs: list[tuple[int, int]], boot: str
) -> list[RunDiscovery]:
    nodes = [await stack.enter_async_context(discovery_node(r, s, (boot,))) for r, s in specs]
    async with trio.open_nursery() as nursery:
        for node in nodes:
            nursery.start_soon(node.announced.wait)
    return nodes


async def rogue_with_garbage_card(stack: AsyncExitStack, boot: str) -> str:
    """A stock DHT (no card validator) that provides run 1 and serves a garbage card."""
    host = await stack.enter_async_context(running_host(create_new_key_pair()))
    dht = KadDHT(host, DHTMode.SERVER)
    await stack.enter_async_context(background_trio_service(dht))
    await host.connect(peer_info(boot))
    await dht.add_peer(peer_info(boot).peer_id)
    dht.value_store.put(card_key(str(host.get_id())).encode(), b"\x00\x02{}garbage")
    await dht.provider_store.provide(run_key(1))
    return str(host.get_id())


def test_a_newcomer_finds_its_run_and_stage_through_the_dht_alone() -> None:
    async def main() -> None:
        async with AsyncExitStack() as stack:
            data = await stack.enter_async_context(discovery_node(1, 0))
            boot = data.book.own.address
            *run1, liar = await start_all(stack, [(1, 1), (1, 2), (1, 2), (2, 1)], boot)
            # A peer of run 2 that also provides run 1's key: its signed card says run 2.
            issued_ms = int(time.time() * 1000) + 1000  # newer than its own card
            liar_card = PeerCard(
                peer_id(liar), 2, 1, "relay", "oregon", liar.book.own.address, issued_ms
            )
            await liar.directory.announce(sign_card(liar_card, liar.key), [run_key(1)])
            garbage = await rogue_with_garbage_card(stack, boot)

            newcomer = await stack.enter_async_context(
                discovery_node(1, 2, (boot,), use_hints=False)
            )
            expected = {peer_id(n) for n in [data, *run1]}
            await eventually(lambda: set(newcomer.book.peers) == expected, "all of run 1")
            await eventually(lambda: newcomer.counters.cards_dropped >= 2, "bad cards dropped")
            assert {garbage, peer_id(liar)} <= set(newcomer.refused)

            assert set(newcomer.book.peers) == expected
            assert newcomer.counters.dht_peers == len(expected)
            assert newcomer.counters.exchanges == newcomer.counters.hints_used == 0
            replicas = await newcomer.replicas_of(2)
            assert {r.peer_id for r in replicas} == {peer_id(n) for n in run1[1:]}
            assert all(r.stage == 2 and r.region == "oregon" for r in replicas)
            # The peer of run 2 learned nobody of run 1; the data node learned the newcomer.
            assert not set(liar.book.peers) & expected
            await eventually(lambda: peer_id(newcomer) in data.book.peers, "data sees newcomer")
            assert set(data.book.peers) == expected - {peer_id(data)} | {peer_id(newcomer)}

    trio.run(main)


def test_hints_reach_subscribers_and_bad_ones_are_dropped() -> None:
    async def main() -> None:
        async with AsyncExitStack() as stack:
            # A long period keeps the DHT quiet: what the nodes learn here, hints told them.
            quiet: dict[str, Any] = {"reannounce_s": 3600.0}
            first = await stack.enter_async_context(discovery_node(1, 1, **quiet))
            boot = first.book.own.address
            second = await stack.enter_async_context(discovery_node(1, 2, (boot,), **quiet))
            await eventually(lambda: peer_id(second) in first.book.peers, "joined hint or DHT")

            await _until(
                lambda: second.publish_hint("spare"),
                lambda: first.book.spare.get(peer_id(second)) == 2,
            )
            assert first.counters.hints_used >= 1

            keys = create_new_key_pair()
            rogue_host = await stack.enter_async_context(running_host(keys))
            # Pubsub notices connections opened after it starts; so start it, then dial.
            rogue = await stack.enter_async_context(
                HintChannel(rogue_host, hint_topic(1)).running()
            )
            await rogue_host.connect(peer_info(boot))
            # Garbage, and a well-formed hint about another peer (second's address): both dropped.
            lie = encode_hint(second._hint("joined")).replace(b'"stage":2', b'"stage":1')
            rogue_id = str(rogue_host.get_id())
            await _until(
                lambda: _publish_all(rogue, [b"not json", lie]),
                lambda: first.counters.hints_dropped >= 2,
            )
            assert Offence.MALFORMED_MESSAGE in first.book.rpc.scores.offences[rogue_id]
            assert rogue_id not in first.book.peers
            assert first.book.peers[peer_id(second)].stage == 2

            await _until(
                lambda: second.publish_hint("leaving"),
                lambda: peer_id(second) not in first.book.peers,
            )
            # Its provider record and card are still in the DHT; they no longer count.
            await first.find_run_peers()
            assert peer_id(second) not in first.book.peers

            # A reader whose clock is an hour ahead finds every card stale and learns nobody.
            late = await stack.enter_async_context(
                discovery_node(1, 1, (boot,), use_hints=False, wall_offset_ms=3_600_000)
            )
            await eventually(lambda: late.counters.stale_cards >= 1, "stale cards dropped")
            assert not late.book.peers

    trio.run(main)


async def _publish_all(channel: HintChannel, messages: list[bytes]) -> bool:
    return all([await channel.publish(message) for message in messages])


async def _until(send: Callable[[], Awaitable[bool]], done: Callable[[], bool]) -> None:
    """Pubsub is lossy and the mesh takes a heartbeat to form: resend until it lands."""
    with trio.fail_after(15):
        while not done():
            await send()
            await trio.sleep(0.3)


def test_full_address_is_what_cards_carry() -> None:
    async def main() -> None:
        async with running_host(create_new_key_pair()) as host:
            assert full_address(host).endswith(f"/p2p/{host.get_id()}")

    trio.run(main)


def test_a_peer_that_is_not_admitted_learns_nothing_and_is_not_learned() -> None:
    strangers: set[str] = set()

    async def admit(peer: str) -> bool:
        return peer not in strangers

    async def main() -> None:
        async with AsyncExitStack() as stack:
            gate = await stack.enter_async_context(discovery_node(1, 0, admit=admit))
            boot = gate.book.own.address
            member = await stack.enter_async_context(discovery_node(1, 1, (boot,)))
            await eventually(lambda: peer_id(member) in gate.book.peers, "member admitted")
            keys = create_new_key_pair()
            strangers.add(str(ID.from_pubkey(keys.public_key)))
            stranger = await stack.enter_async_context(
                discovery_node(1, 2, (boot,), keys=keys, period_s=0.3)
            )
            await eventually(
                lambda: gate.book.rpc.refused.get(peer_id(stranger), 0) >= 3, "refused"
            )
            await stranger.find_run_peers()
            assert peer_id(stranger) not in gate.book.peers
            assert gate.directory.refused[peer_id(stranger)] >= 1  # its DHT queries were reset
            assert stranger.counters.dht_peers == 0

    trio.run(main)


def test_discovery_that_fails_restarts_and_keeps_finding_peers() -> None:
    async def main() -> None:
        async with AsyncExitStack() as stack:
            first = await stack.enter_async_context(discovery_node(1, 1))
            boot = first.book.own.address
            second = await stack.enter_async_context(discovery_node(1, 2, (boot,), period_s=0.3))
            await eventually(lambda: peer_id(first) in second.book.peers, "first found")
            working = second.find_run_peers

            async def fail_once() -> int:
                second.find_run_peers = working  # type: ignore[method-assign]
                raise RuntimeError("a DHT lookup blew up")

            second.find_run_peers = fail_once  # type: ignore[method-assign]
            await eventually(lambda: second.counters.restarts == 1, "discovery restarted")
            third = await stack.enter_async_context(discovery_node(1, 1, (boot,)))
            await eventually(lambda: peer_id(third) in second.book.peers, "third found after")

    trio.run(main)
