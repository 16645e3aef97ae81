"""A node's addresses: what it listens on, what it advertises, and which peer lists it takes."""

from __future__ import annotations

import multiaddr
import pytest
import trio
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.peer.id import ID

from gwtf.errors import ConfigError, ProtocolError
from gwtf.node.p2p.addresses import (
    MAX_ADDRESSES,
    MAX_CIRCUIT_ADDRESSES,
    advertised,
    check_peer_addresses,
    parse_announce,
    parse_listen,
    with_circuits,
)
from gwtf.node.p2p.discovery_records import PeerCard, card_key, open_card, sign_card
from gwtf.node.p2p.host import full_addresses, running_host
from gwtf.node.p2p.identity import new_identity
from gwtf.node.p2p.rpc import RequestResponse
from gwtf.node.runtime.discovery.address_book import format_record, own_record, parse_record

PEER = str(ID.from_pubkey(create_new_key_pair(b"\x01" * 32).public_key))


def _ma(text: str) -> multiaddr.Multiaddr:
    return multiaddr.Multiaddr(text)


def _interfaces(family: int) -> list[str]:
    return {4: ["198.18.0.2", "169.254.3.3", "10.0.0.5"], 6: ["2001:db8::2"]}[family]


def test_announced_addresses_lead_and_wildcards_become_the_interfaces() -> None:
    chosen = advertised(
        [_ma("/ip4/0.0.0.0/tcp/4001"), _ma("/ip4/127.0.0.1/tcp/4002")],
        [_ma("/dns4/home.example/tcp/4001")],
        _interfaces,
    )
    # Link-local never, loopback not beside routable addresses, the announced one first.
    assert [str(a) for a in chosen] == [
        "/dns4/home.example/tcp/4001",
        "/ip4/198.18.0.2/tcp/4001",
        "/ip4/10.0.0.5/tcp/4001",
    ]


def test_a_loopback_node_advertises_loopback_and_the_list_is_bounded() -> None:
    assert [str(a) for a in advertised([_ma("/ip4/127.0.0.1/tcp/7")], [], _interfaces)] == [
        "/ip4/127.0.0.1/tcp/7"
    ]
    # A machine with no interface but loopback still has an address to give.
    assert [str(a) for a in advertised([_ma("/ip4/0.0.0.0/tcp/7")], [], lambda _f: [])] == [
        "/ip4/127.0.0.1/tcp/7"
    ]
    many = [_ma(f"/ip4/198.18.1.{i}/tcp/7") for i in range(10)]
    assert len(advertised(many, [], _interfaces)) == MAX_ADDRESSES


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("/ip4/0.0.0.0/udp/4001", "is not a TCP address"),
        ("/dns4/home.example/tcp/4001", "is not a TCP address"),  # a name is not bindable
        ("not an address", "bad listen address"),
    ],
)
def test_bad_listen_addresses_are_refused(text: str, fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        parse_listen(text)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("/ip4/0.0.0.0/tcp/4001", "names no host"),
        ("/ip4/203.0.113.7/tcp/0", "has port 0"),
        (f"/ip4/203.0.113.7/tcp/4001/p2p/{PEER}", "is not a TCP address"),
    ],
)
def test_bad_announced_addresses_are_refused(text: str, fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        parse_announce(text)


def test_a_peers_list_is_bounded_and_must_name_the_peer() -> None:
    good = [f"/ip4/198.18.0.{i}/tcp/4001/p2p/{PEER}" for i in range(MAX_ADDRESSES)]
    check_peer_addresses(good, PEER)
    with pytest.raises(ProtocolError, match="addresses, expected"):
        check_peer_addresses([*good, good[0]], PEER)
    other = str(ID.from_pubkey(create_new_key_pair(b"\x02" * 32).public_key))
    with pytest.raises(ProtocolError, match="names another peer"):
        check_peer_addresses([good[0], f"/ip4/198.18.0.9/tcp/1/p2p/{other}"], PEER)
    with pytest.raises(ProtocolError, match="is neither HOST/tcp/PORT"):
        check_peer_addresses([f"/ip4/198.18.0.9/udp/1/p2p/{PEER}"], PEER)
    with pytest.raises(ProtocolError, match="characters"):
        check_peer_addresses([f"/dns4/{'a' * 200}/tcp/1/p2p/{PEER}"], PEER)


def test_a_peer_record_line_carries_every_address_and_refuses_too_many() -> None:
    addresses = [f"/ip4/198.18.0.{i}/tcp/4001/p2p/{PEER}" for i in range(3)]
    line = " ".join([addresses[0], "tokyo", *addresses[1:]])
    record = parse_record(line)
    assert record.addresses == tuple(addresses) and record.region == "tokyo"
    assert format_record(record) == line
    # A one-address line reads as before.
    assert parse_record(f"{addresses[0]} tokyo").addresses == (addresses[0],)
    too_many = " ".join([addresses[0], "tokyo", *[addresses[1]] * MAX_ADDRESSES])
    with pytest.raises(ProtocolError, match="at most"):
        parse_record(too_many)


def test_a_card_carries_other_addresses_and_a_card_without_them_has_no_field() -> None:
    keys = create_new_key_pair(b"\x03" * 32)
    peer = str(ID.from_pubkey(keys.public_key))
    first, *others = [f"/ip4/198.18.0.{i}/tcp/4001/p2p/{peer}" for i in range(MAX_ADDRESSES)]
    card = PeerCard(peer, 1, 1, "relay", "tokyo", first, 1000, tuple(others))
    assert open_card(card_key(peer), sign_card(card, keys.private_key)) == card
    single = PeerCard(peer, 1, 1, "relay", "tokyo", first, 1000)
    assert b'"addrs"' not in sign_card(single, keys.private_key)
    with pytest.raises(ProtocolError, match="names another peer"):
        PeerCard(peer, 1, 1, "relay", "tokyo", first, 1000, (f"/ip4/1.2.3.4/tcp/1/p2p/{PEER}",))


def test_a_host_on_every_interface_advertises_its_announced_address_first() -> None:
    async def main() -> None:
        listen = ("/ip4/0.0.0.0/tcp/0",)
        announce = ("/ip4/203.0.113.7/tcp/4001",)
        async with running_host(new_identity(), listen, announce) as host:
            addresses = full_addresses(host)
            record = own_record(RequestResponse(host), "tokyo")
            port = host.get_transport_addrs()[0].value_for_protocol("tcp")
        peer = str(host.get_id())
        assert addresses[0] == f"/ip4/203.0.113.7/tcp/4001/p2p/{peer}"
        assert len(addresses) >= 2 and not any("/0.0.0.0/" in a for a in addresses)
        assert all(a.endswith(f"/tcp/{port}/p2p/{peer}") for a in addresses[1:])
        assert record.addresses == tuple(addresses)

    trio.run(main)


def test_a_peer_may_advertise_circuits_through_other_peers_only() -> None:
    relay = str(ID.from_pubkey(create_new_key_pair(b"\x03" * 32).public_key))
    circuit = f"/ip4/198.18.0.1/tcp/4001/p2p/{relay}/p2p-circuit/p2p/{PEER}"
    check_peer_addresses([circuit, f"/ip4/198.19.0.2/tcp/4001/p2p/{PEER}"], PEER)
    with pytest.raises(ProtocolError, match="names another peer"):
        check_peer_addresses([f"/ip4/198.18.0.1/tcp/4001/p2p/{PEER}/p2p-circuit/p2p/{relay}"], PEER)
    with pytest.raises(ProtocolError, match="relays the peer through itself"):
        check_peer_addresses([f"/ip4/198.18.0.1/tcp/4001/p2p/{PEER}/p2p-circuit/p2p/{PEER}"], PEER)
    with pytest.raises(ProtocolError, match="is neither"):
        check_peer_addresses([f"/ip4/198.18.0.1/tcp/4001/p2p-circuit/p2p/{PEER}"], PEER)


def test_circuits_lead_a_nodes_addresses_within_the_limits() -> None:
    relay = str(ID.from_pubkey(create_new_key_pair(b"\x03" * 32).public_key))
    relayed = [f"/ip4/198.18.0.{i}/tcp/1/p2p/{relay}/p2p-circuit" for i in range(3)]
    circuits = [multiaddr.Multiaddr(text) for text in relayed]
    direct = [multiaddr.Multiaddr(f"/ip4/198.19.0.{i}/tcp/1") for i in range(4)]
    room = MAX_ADDRESSES - MAX_CIRCUIT_ADDRESSES
    chosen = with_circuits(direct, circuits)
    assert chosen == circuits[:MAX_CIRCUIT_ADDRESSES] + direct[:room]
    assert with_circuits(direct, []) == direct
