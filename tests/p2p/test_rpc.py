"""Framed request/response between real libp2p hosts on 127.0.0.1, with untrusted peers."""

from __future__ import annotations

import struct
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
import trio
from eth_account import Account
from libp2p.crypto import ed25519
from libp2p.custom_types import TProtocol
from libp2p.peer.id import ID

from gwtf.contracts.encoding import peer_id_of_public_key
from gwtf.errors import ProtocolError
from gwtf.node.p2p.host import full_address, peer_info, running_host
from gwtf.node.p2p.identity import (
    identity_from_key,
    new_identity,
    node_address_of_peer,
    peer_id_of,
    public_key_of,
)
from gwtf.node.p2p.rpc import (
    Decline,
    NotHere,
    PeerTimeout,
    PeerUnavailable,
    RequestDeclined,
    RequestMisdirected,
    RequestResponse,
    RpcLimits,
)
from gwtf.node.p2p.scoring import Offence

ECHO = "/gwtf/test-echo/1.0.0"
LIMITS = RpcLimits(max_request_bytes=4096, max_response_bytes=4096, timeout_s=3.0)


async def reverse(_peer: str, request: bytes) -> bytes:
    if request == b"boom":
        raise RuntimeError("handler bug")
    if request == b"bad":
        raise ProtocolError("undecodable request")
    if request == b"again":
        raise Decline("already done")
    if request == b"moved":
        raise NotHere("not a stage 2 relay")
    return request[::-1]


Scenario = Callable[[RequestResponse, RequestResponse], Awaitable[None]]


def run_pair(tmp_path: Path, scenario: Scenario, admit_client: bool = True) -> None:
    async def admit(peer: str) -> bool:
        return admit_client

    async def main() -> None:
        server_key = new_identity()
        client_key = new_identity()
        async with running_host(server_key) as server_host, running_host(client_key) as client_host:
            server = RequestResponse(server_host, admit=admit)
            server.serve(ECHO, reverse, LIMITS)
            client = RequestResponse(client_host)
            await client_host.connect(peer_info(full_address(server_host)))
            with trio.fail_after(20):
                await scenario(server, client)

    trio.run(main)


def test_request_gets_the_reply(tmp_path: Path) -> None:
    async def scenario(server: RequestResponse, client: RequestResponse) -> None:
        reply = await client.request(server.host.get_id(), ECHO, b"hello", LIMITS)
        assert reply == b"olleh"

    run_pair(tmp_path, scenario)


def test_failing_handler_does_not_wedge_the_connection(tmp_path: Path) -> None:
    async def scenario(server: RequestResponse, client: RequestResponse) -> None:
        with pytest.raises(PeerUnavailable):
            await client.request(server.host.get_id(), ECHO, b"boom", LIMITS)
        with pytest.raises(PeerUnavailable):
            await client.request(server.host.get_id(), ECHO, b"bad", LIMITS)
        assert await client.request(server.host.get_id(), ECHO, b"after", LIMITS) == b"retfa"
        offences = server.scores.offences[str(client.host.get_id())]
        assert offences == [Offence.HANDLER_FAILURE, Offence.MALFORMED_MESSAGE]

    run_pair(tmp_path, scenario)


def test_a_declined_request_is_told_apart_and_not_charged(tmp_path: Path) -> None:
    async def scenario(server: RequestResponse, client: RequestResponse) -> None:
        with pytest.raises(RequestDeclined, match="already done"):
            await client.request(server.host.get_id(), ECHO, b"again", LIMITS)
        with pytest.raises(RequestMisdirected, match="not a stage 2 relay"):
            await client.request(server.host.get_id(), ECHO, b"moved", LIMITS)
        with pytest.raises(PeerUnavailable) as refused:
            await client.request(server.host.get_id(), ECHO, b"bad", LIMITS)
        assert not isinstance(refused.value, RequestDeclined)
        offences = server.scores.offences[str(client.host.get_id())]
        assert offences == [Offence.MALFORMED_MESSAGE]  # the declines cost the client nothing

    run_pair(tmp_path, scenario)


def test_oversized_and_garbage_frames_are_dropped_and_scored(tmp_path: Path) -> None:
    async def raw(client: RequestResponse, server: RequestResponse, data: bytes) -> None:
        stream = await client.host.new_stream(server.host.get_id(), [TProtocol(ECHO)])
        await stream.write(data)
        await stream.close()
        with pytest.raises(Exception):  # noqa: B017 - the server resets: any stream error is right
            with trio.fail_after(3):
                reply = await stream.read(100)
                if not reply:
                    raise EOFError("reset")

    async def scenario(server: RequestResponse, client: RequestResponse) -> None:
        await raw(client, server, struct.pack(">I", 10_000_000) + b"x" * 64)  # announces 10 MB
        await raw(client, server, struct.pack(">I", 100) + b"short")  # closes mid-frame
        offences = server.scores.offences[str(client.host.get_id())]
        assert offences == [Offence.OVERSIZED_FRAME, Offence.MALFORMED_MESSAGE]
        assert await client.request(server.host.get_id(), ECHO, b"still", LIMITS) == b"llits"

    run_pair(tmp_path, scenario)


def test_unknown_protocol_version_is_refused(tmp_path: Path) -> None:
    async def scenario(server: RequestResponse, client: RequestResponse) -> None:
        with pytest.raises(PeerUnavailable):
            await client.request(server.host.get_id(), "/gwtf/test-echo/9.0.0", b"x", LIMITS)
        assert await client.request(server.host.get_id(), ECHO, b"ok", LIMITS) == b"ko"

    run_pair(tmp_path, scenario)


def test_unadmitted_peer_is_refused_and_counted(tmp_path: Path) -> None:
    async def scenario(server: RequestResponse, client: RequestResponse) -> None:
        with pytest.raises(PeerUnavailable):
            await client.request(server.host.get_id(), ECHO, b"let me in", LIMITS)
        assert server.refused == {str(client.host.get_id()): 1}

    run_pair(tmp_path, scenario, admit_client=False)


def test_silent_peer_times_out(tmp_path: Path) -> None:
    silent = "/gwtf/test-silent/1.0.0"

    async def never_answer(_peer: str, _request: bytes) -> bytes:
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    async def scenario(server: RequestResponse, client: RequestResponse) -> None:
        server.serve(silent, never_answer, RpcLimits(timeout_s=30))
        short = RpcLimits(timeout_s=0.5)
        with pytest.raises(PeerTimeout):
            await client.request(server.host.get_id(), silent, b"hello?", short)
        assert await client.request(server.host.get_id(), ECHO, b"ab", LIMITS) == b"ba"

    run_pair(tmp_path, scenario)


def test_a_node_key_is_its_libp2p_identity_and_its_peer_id_names_the_node() -> None:
    account = Account.create()
    identity = identity_from_key(bytes(account.key))
    assert identity_from_key(bytes(account.key)).public_key == identity.public_key
    peer = peer_id_of(identity)
    assert node_address_of_peer(peer) == account.address
    assert peer.to_bytes() == peer_id_of_public_key(public_key_of(identity))
    with pytest.raises(ProtocolError, match="secp256k1"):
        node_address_of_peer(ID.from_pubkey(ed25519.create_new_key_pair().public_key))
    with pytest.raises(ProtocolError, match="32 bytes"):
        identity_from_key(b"short")


def test_a_stream_opened_ahead_is_the_one_the_request_uses(tmp_path: Path) -> None:
    """``open`` dials and negotiates the stream under its own deadline; the request then
    only sends (a hop's ack deadline covers the hop, not the dial); an unknown peer fails."""

    async def scenario(server: RequestResponse, client: RequestResponse) -> None:
        peer = server.host.get_id()
        await client.open(peer, ECHO, 5.0)
        assert client.streams_opened == 1
        assert await client.request(peer, ECHO, b"ab", LIMITS) == b"ba"
        assert client.streams_opened == 1
        nobody = ID.from_pubkey(new_identity().public_key)
        with pytest.raises(PeerUnavailable):
            await client.open(nobody, ECHO, 5.0)

    run_pair(tmp_path, scenario)
