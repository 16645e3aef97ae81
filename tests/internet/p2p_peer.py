"""Two real libp2p hosts for the test bed: a public one and one at home that only it can dial.

    python -m tests.internet.p2p_peer public
    python -m tests.internet.p2p_peer home PUBLIC_ADDRESS

The public host listens on every interface and prints ``address A`` for each address it
advertises. The home host dials it and says hello; the public host then asks the home host a
question over the connection the home opened (nothing can dial a home), prints ``answered
REPLY over ADDRESS`` (where that connection came from: the home's router) and exits.
"""

from __future__ import annotations

import sys

import trio
from libp2p.peer.id import ID

from gwtf.node.p2p.host import full_addresses, peer_info, running_host
from gwtf.node.p2p.identity import new_identity
from gwtf.node.p2p.rpc import RequestResponse, RpcLimits

HELLO = "/gwtf/test-hello/1.0.0"
ASK = "/gwtf/test-ask/1.0.0"
LIMITS = RpcLimits(max_request_bytes=256, max_response_bytes=256, timeout_s=5.0)
EVERY_INTERFACE = ("/ip4/0.0.0.0/tcp/4001",)
DEADLINE_S = 20.0


async def public() -> None:
    async with running_host(new_identity(), EVERY_INTERFACE) as host:
        rpc = RequestResponse(host)
        greeted: trio.MemoryReceiveChannel[str]
        greet, greeted = trio.open_memory_channel[str](1)

        async def hello(peer: str, _request: bytes) -> bytes:
            greet.send_nowait(peer)
            return b"welcome"

        rpc.serve(HELLO, hello, LIMITS)
        for address in full_addresses(host):
            print("address", address, flush=True)
        with trio.fail_after(DEADLINE_S):
            peer = await greeted.receive()
            reply = await rpc.request(ID.from_base58(peer), ASK, b"ping", LIMITS)
        connection = host.get_network().connections[ID.from_base58(peer)][0]
        seen = " ".join(str(addr) for addr in connection.get_transport_addresses())
        print("answered", reply.decode(), "over", seen, flush=True)


async def home(address: str) -> None:
    async with running_host(new_identity(), EVERY_INTERFACE) as host:
        rpc = RequestResponse(host)
        asked = trio.Event()

        async def ask(_peer: str, request: bytes) -> bytes:
            asked.set()
            return b"pong" if request == b"ping" else b"?"

        rpc.serve(ASK, ask, LIMITS)
        info = peer_info(address)
        with trio.fail_after(DEADLINE_S):
            await host.connect(info)
            print("hello", (await rpc.request(info.peer_id, HELLO, b"hi", LIMITS)).decode())
            await asked.wait()
            await trio.sleep(0.5)  # lets the answer leave before the host closes


def main() -> None:
    if sys.argv[1] == "public":
        trio.run(public)
    else:
        trio.run(home, sys.argv[2])


if __name__ == "__main__":
    main()
