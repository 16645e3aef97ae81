"""A node's reachability verdict drives its relaying (real libp2p hosts on loopback): under
``auto`` it holds relay slots until peers are known to reach it, drops them when they are and
takes them again when they no longer are; a relay stops relaying while it is not reachable; and
dialers trust a volunteer relay only when its signed card says it relays and the run admits it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest
import trio
from libp2p.peer.id import ID

from gwtf.node.p2p.discovery_records import PeerCard
from gwtf.node.p2p.host import full_address, peer_info, running_host
from gwtf.node.p2p.identity import new_identity
from gwtf.node.p2p.reachability import Reachability
from gwtf.node.p2p.relay import RelayRefused, is_circuit, reserve
from gwtf.node.p2p.relay_service import circuit_relay
from gwtf.node.p2p.rpc import RequestResponse
from gwtf.node.runtime.relaying import Relaying

REACHABLE = Reachability(True, 3, 0, 3, 1, "/ip4/198.18.1.2/tcp/4001")
BEHIND_NAT = Reachability(False, 0, 3, 3, 2)


def run_bounded(main: Callable[[], Awaitable[None]]) -> None:
    async def bounded() -> None:
        with trio.fail_after(30):
            await main()

    trio.run(bounded)


async def wait_until(condition: Callable[[], bool]) -> None:
    while not condition():
        await trio.sleep(0.05)


def test_under_auto_the_verdict_takes_and_drops_relay_slots() -> None:
    async def main() -> None:
        async with (
            running_host(new_identity()) as relay_host,
            circuit_relay(relay_host, serve=True),
        ):
            relaying = Relaying((full_address(relay_host),), forced=None)
            changes: list[int] = []
            async with (
                running_host(new_identity(), circuits=relaying.circuits) as host,
                circuit_relay(host, circuits_from=relaying.holds_slot_at),
                trio.open_nursery() as nursery,
            ):
                rpc = RequestResponse(host)
                # Not on loopback only, and not checked yet: it holds a slot before it is known.
                await relaying.start(rpc, nursery, lambda: changes.append(1))
                assert relaying.reachable() is None and changes == [1]
                assert is_circuit(host.get_addrs()[0])
                line = relaying.describe(BEHIND_NAT)
                assert line.startswith(
                    f"behind NAT: running outbound-only through relay {full_address(relay_host)}"
                ), line
                relaying.heard(REACHABLE)
                assert relaying.slots is None and changes == [1, 1]
                assert not any(is_circuit(addr) for addr in host.get_addrs())
                relaying.heard(BEHIND_NAT)
                await wait_until(lambda: relaying.holds_slot_at(relay_host.get_id()))
                assert is_circuit(host.get_addrs()[0]) and len(changes) == 3
                nursery.cancel_scope.cancel()

    run_bounded(main)


@pytest.mark.parametrize("forced", [True, None])
def test_a_reachable_node_or_one_on_loopback_only_holds_no_slot(forced: bool | None) -> None:
    async def main() -> None:
        async with running_host(new_identity()) as relay_host, circuit_relay(relay_host, True):
            relaying = Relaying((full_address(relay_host),), forced=forced, loopback_only=True)
            async with running_host(new_identity()) as host, trio.open_nursery() as nursery:
                await relaying.start(RequestResponse(host), nursery, lambda: None)
                relaying.heard(BEHIND_NAT if forced else REACHABLE)
                assert relaying.slots is None and relaying.reachable() is True
                nursery.cancel_scope.cancel()

    run_bounded(main)


def test_a_relay_stops_relaying_while_its_own_check_says_nobody_can_dial_it() -> None:
    async def main() -> None:
        relaying = Relaying((), forced=None, relay_service=True)
        async with (
            running_host(new_identity()) as relay_host,
            circuit_relay(relay_host, serve=True, serving=relaying.serving),
            running_host(new_identity()) as client,
        ):
            relay = peer_info(full_address(relay_host))
            assert await reserve(client, relay, 5.0) > 0  # not known yet: it relays
            assert not relaying.advertises_relay()
            relaying.heard(BEHIND_NAT)
            with pytest.raises(RelayRefused, match="PERMISSION_DENIED"):
                await reserve(client, relay, 5.0)
            relaying.heard(REACHABLE)
            assert await reserve(client, relay, 5.0) > 0
            assert relaying.advertises_relay()

    run_bounded(main)


DATA_NODE = str(ID.from_pubkey(new_identity().public_key))


def _card(peer: str, relays: bool, reachable: bool | None = True) -> PeerCard:
    address = f"/ip4/198.18.3.2/tcp/4001/p2p/{peer}"
    circuit = f"/ip4/198.18.1.2/tcp/4001/p2p/{DATA_NODE}/p2p-circuit/p2p/{peer}"
    return PeerCard(
        peer, 1, 2, "relay", "tokyo", address, 1, (circuit,), reachable, 1 if reachable else 0,
        relays=relays,
    )  # fmt: skip


def test_a_volunteer_relay_is_trusted_when_its_card_says_so_and_the_run_admits_it() -> None:
    volunteer, stranger, plain = (str(ID.from_pubkey(new_identity().public_key)) for _ in "abc")
    cards = {
        volunteer: _card(volunteer, relays=True),
        stranger: _card(stranger, relays=True),
        plain: _card(plain, relays=False),
    }

    async def admit(peer: str) -> bool:
        return peer != stranger

    relaying = Relaying((), admit=admit)
    relaying.cards = cards.get

    async def main() -> None:
        at = await relaying.relay_addresses(ID.from_base58(volunteer))
        assert [str(addr) for addr in at] == ["/ip4/198.18.3.2/tcp/4001"]  # its direct address
        assert await relaying.relay_addresses(ID.from_base58(stranger)) == []
        assert await relaying.relay_addresses(ID.from_base58(plain)) == []

    trio.run(main)


def test_a_reachable_node_waits_to_be_dialled_by_a_neighbour_whose_card_says_it_cannot_be() -> None:
    home, public = (str(ID.from_pubkey(new_identity().public_key)) for _ in "ab")
    cards = {home: _card(home, False, reachable=False), public: _card(public, False)}
    reachable = Relaying((), forced=True)
    reachable.cards = cards.get
    assert reachable.waits_for(home) and not reachable.waits_for(public)
    assert not reachable.waits_for("unknown")
    # Both behind NAT: the one with the lower peer id dials, through the circuit.
    lower, higher = sorted(str(ID.from_pubkey(new_identity().public_key)) for _ in "ab")
    cards[lower], cards[higher] = (
        _card(lower, False, reachable=False),
        _card(higher, False, reachable=False),
    )
    for own, other, waits in ((lower, higher, False), (higher, lower, True)):
        behind_nat = Relaying((), forced=False, own_id=own)
        behind_nat.cards = cards.get
        assert behind_nat.waits_for(other) is waits
        assert not behind_nat.waits_for(public)
    unknown = Relaying((), forced=None, own_id=higher)  # its own check has not said yet
    unknown.cards = cards.get
    assert not unknown.waits_for(lower)


def test_a_node_behind_nat_also_takes_slots_at_admitted_volunteer_relays_up_to_its_limit() -> None:
    """Its own relay first; then, as their cards arrive, volunteers whose card says they relay
    and that the run admits, until it holds ``most_relays``; a stranger's card is passed over."""

    def card_of(host: object, relays: bool = True) -> PeerCard:
        address = full_address(host)  # type: ignore[arg-type]
        peer = str(peer_info(address).peer_id)
        return PeerCard(peer, 1, 2, "relay", "tokyo", address, 1, (), True, 1, relays=relays)

    async def main() -> None:
        async with (
            running_host(new_identity()) as own,
            running_host(new_identity()) as stranger,
            running_host(new_identity()) as plain,
            running_host(new_identity()) as first,
            running_host(new_identity()) as second,
            circuit_relay(own, serve=True),
            circuit_relay(stranger, serve=True),
            circuit_relay(plain, serve=True),
            circuit_relay(first, serve=True),
            circuit_relay(second, serve=True),
        ):

            async def admit(peer: str) -> bool:
                return peer != str(stranger.get_id())

            relaying = Relaying((full_address(own),), forced=False, admit=admit, most_relays=2)
            # Read in this order: the second volunteer would be a third relay.
            cards = [card_of(stranger), card_of(plain, False), card_of(first), card_of(second)]
            relaying.all_cards = lambda: cards
            async with (
                running_host(new_identity(), circuits=relaying.circuits) as host,
                trio.open_nursery() as nursery,
            ):
                await relaying.start(RequestResponse(host), nursery, lambda: None)
                await wait_until(lambda: relaying.holds_slot_at(first.get_id()))
                assert relaying.holds_slot_at(own.get_id()) and relaying.slots is not None
                for passed_over in (stranger, plain, second):
                    assert not relaying.slots.keeps(passed_over.get_id())
                through = {str(a).split("/p2p/")[1].split("/")[0] for a in relaying.circuits()}
                assert through == {str(own.get_id()), str(first.get_id())}
                nursery.cancel_scope.cancel()

    run_bounded(main)
