"""Real libp2p hosts for the test bed's dialing and reachability tests.

    python -m tests.internet.reach_peer public
    python -m tests.internet.reach_peer home PUBLIC_ADDRESS
    python -m tests.internet.reach_peer dial PER_ADDRESS_S ADDRESS [ADDRESS ...]
    python -m tests.internet.reach_peer witness PORT
    python -m tests.internet.reach_peer check PORT ANNOUNCE|- WITNESS [WITNESS ...]
    python -m tests.internet.reach_peer node PORT WITNESS [WITNESS ...]
    python -m tests.internet.reach_peer forwarder
    python -m tests.internet.reach_peer evidence-home FORWARDER_ADDRESS FOLDER
    python -m tests.internet.reach_peer audit DIGEST HOME_ADDRESS FORWARDER_ADDRESS

``public`` listens on every interface (port 4001), prints ``address A`` for what it advertises
and serves until killed. ``home`` keeps ``PUBLIC_ADDRESS`` as its neighbour (the node's
``NeighbourKeeper``, as a node runs it), asks it something every 0.1 s and prints ``up T`` /
``down T`` (wall-clock seconds) when the answers start or stop, and ``reconnected T`` when it
was dialled again (by the keeper, or by a request's own dial). ``dial`` dials one peer at its
addresses in order (all naming the same peer), each within PER_ADDRESS_S, and prints
``reached ADDRESS after S`` or ``failed after S``.
``witness`` serves peer exchange and dial-backs on PORT and prints ``address A``. ``check``
listens on PORT (advertising ANNOUNCE first unless it is ``-``), introduces itself to each
WITNESS by peer exchange (so the witness holds its claimed addresses), asks them to dial it back
and prints ``verdict True|False|None DESCRIPTION``. ``node`` runs a live node's reachability
watch (``own_reachability``, UPnP on) after introducing itself to the WITNESSes and prints the
UPnP attempt's log line (``log …``), then ``verdict …`` and ``card REACH`` (what its card says).
``forwarder`` forwards evidence requests (``/gwtf/evidence-via/1.0.0``) as every node with
receipts does, and prints ``address A``. ``evidence-home`` keeps a frame of ``FRAME_BYTES`` in
an evidence archive under FOLDER, serves it, keeps the forwarder as its neighbour, and prints
``digest HEX`` and ``address A``. ``audit`` fetches the frame as an auditor's evidence source
does, from the peers it reaches or through them, and prints ``fetched N bytes`` or ``missing``.
"""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path

import multiaddr
import trio

from gwtf.node.audit.replays import evidence_source
from gwtf.node.audit.runner import connect_peers
from gwtf.node.p2p.dialing import Dialer, DialFailed
from gwtf.node.p2p.host import full_addresses, peer_info, running_host
from gwtf.node.p2p.identity import new_identity, node_address_of_peer
from gwtf.node.p2p.keepalive import NeighbourKeeper
from gwtf.node.p2p.reachability import DialbackService, Reachability, ReachabilityCheck
from gwtf.node.p2p.rpc import PeerUnavailable, RequestResponse, RpcLimits
from gwtf.node.receipts.evidence import serve_evidence, serve_evidence_forwarding
from gwtf.node.runtime.discovery.address_book import AddressBook, own_record
from gwtf.node.runtime.discovery.own_reachability import serve_dialbacks, watch_reachability
from gwtf.node.runtime.discovery.run_discovery import DiscoverySettings, RunDiscovery
from gwtf.node.store.evidence import EvidenceArchive

ECHO = "/gwtf/test-echo/1.0.0"
LIMITS = RpcLimits(max_request_bytes=64, max_response_bytes=64, timeout_s=1.0)
EVERY_INTERFACE = ("/ip4/0.0.0.0/tcp/4001",)
#: What a live node gives its keeper (twice the flow protocol's keep-alive timeout).
DEAD_AFTER_S = 10.0


async def echo(_peer: str, request: bytes) -> bytes:
    return request


async def public() -> None:
    async with running_host(new_identity(), EVERY_INTERFACE) as host:
        rpc = RequestResponse(host)
        rpc.serve(ECHO, echo, LIMITS)
        NeighbourKeeper(rpc, lambda: ()).serve()
        for address in full_addresses(host):
            print("address", address, flush=True)
        await trio.sleep_forever()


async def home(address: str) -> None:
    async with running_host(new_identity(), EVERY_INTERFACE) as host:
        rpc = RequestResponse(host)
        info = peer_info(address)
        host.get_peerstore().add_addrs(info.peer_id, info.addrs, 3600)
        keeper = NeighbourKeeper(rpc, lambda: [str(info.peer_id)], dead_after_s=DEAD_AFTER_S)
        keeper.serve()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(keeper.run)
            up, reconnects = False, 0
            while True:
                try:
                    await rpc.request(info.peer_id, ECHO, b"?", LIMITS)
                    answered = True
                except PeerUnavailable:
                    answered = False
                if answered != up:
                    up = answered
                    print("up" if up else "down", time.time(), flush=True)
                # A new connection, by the keeper or by a request's own dial.
                if rpc.dialer.dials > 1 + reconnects:
                    reconnects = rpc.dialer.dials - 1
                    print("reconnected", time.time(), flush=True)
                await trio.sleep(0.1)


async def dial(per_address_s: float, addresses: list[str]) -> None:
    infos = [peer_info(address) for address in addresses]
    addrs: list[multiaddr.Multiaddr] = [addr for info in infos for addr in info.addrs]
    async with running_host(new_identity(), EVERY_INTERFACE) as host:
        dialer = Dialer(host, per_address_s=per_address_s)
        started = trio.current_time()
        try:
            await dialer.connect(infos[0].peer_id, addrs)
        except DialFailed:
            print("failed after", trio.current_time() - started, flush=True)
            return
        conn = host.get_network().get_connections(infos[0].peer_id)[0]
        remote = conn.get_transport_addresses()
        print("reached", remote[0] if remote else "?", "after", trio.current_time() - started)


def _book(rpc: RequestResponse) -> AddressBook:
    book = AddressBook(rpc, own_record(rpc, "oregon"), lambda _record: None)
    book.serve()
    return book


async def witness(port: int) -> None:
    async with running_host(new_identity(), (f"/ip4/0.0.0.0/tcp/{port}",)) as host:
        rpc = RequestResponse(host)
        book = _book(rpc)
        claimed = lambda peer: book.peers[peer].addresses if peer in book.peers else ()  # noqa: E731
        DialbackService(rpc, claimed, per_address_s=1.0).serve()
        for address in full_addresses(host):
            print("address", address, flush=True)
        await trio.sleep_forever()


async def check(port: int, announce: str, witnesses: list[str]) -> None:
    listen = (f"/ip4/0.0.0.0/tcp/{port}",)
    announced = () if announce == "-" else (announce,)
    async with running_host(new_identity(), listen, announced) as host:
        rpc = RequestResponse(host)
        book = _book(rpc)
        checking = ReachabilityCheck(rpc)
        checking.serve()
        for address in witnesses:
            await book.exchange_with(address)
        ids = [peer_info(address).peer_id for address in witnesses]
        result = await checking.check(ids, full_addresses(host), int(time.time() * 1000))
        print("verdict", result.reachable, result.describe(), flush=True)


async def node(port: int, witnesses: list[str]) -> None:
    upnp_log = logging.getLogger("gwtf.node.p2p.port_mapping")
    upnp_log.setLevel(logging.INFO)
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("log %(message)s"))
    upnp_log.addHandler(handler)
    identity, verified = new_identity(), []
    async with running_host(identity, (f"/ip4/0.0.0.0/tcp/{port}",), verified=verified) as host:
        rpc = RequestResponse(host)
        book = _book(rpc)
        serve_dialbacks(rpc, book)
        # Discovery is not run here: without its pubsub service running, the hint channel's
        # notifee would hold up every new connection.
        settings = DiscoverySettings(1, 1, "relay", tuple(witnesses), use_hints=False)
        discovery = RunDiscovery(book, identity.private_key, settings)
        for address in witnesses:
            await book.exchange_with(address)
        heard = trio.Event()

        def on_verdict(result: Reachability) -> None:
            print("verdict", result.reachable, result.describe(), flush=True)
            print("card", discovery.own_card().reachable, flush=True)
            heard.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch_reachability, rpc, book, discovery, verified, True, on_verdict)
            await heard.wait()
            nursery.cancel_scope.cancel()


FRAME_BYTES = 3 << 19  # a chunk and a half


async def forwarder() -> None:
    async with running_host(new_identity(), EVERY_INTERFACE) as host:
        rpc = RequestResponse(host)
        serve_evidence_forwarding(rpc, 5.0)
        NeighbourKeeper(rpc, lambda: ()).serve()
        for address in full_addresses(host):
            print("address", address, flush=True)
        await trio.sleep_forever()


async def evidence_home(forwarder_address: str, folder: str) -> None:
    async with running_host(new_identity(), EVERY_INTERFACE) as host:
        rpc = RequestResponse(host)
        archive = EvidenceArchive(Path(folder), keep_epochs=2, epoch_now=lambda: 0)
        digest = archive.keep_frame(0, bytes(range(256)) * (FRAME_BYTES // 256))
        serve_evidence(rpc, archive, 1, 5.0)
        info = peer_info(forwarder_address)
        host.get_peerstore().add_addrs(info.peer_id, info.addrs, 3600)
        keeper = NeighbourKeeper(rpc, lambda: [str(info.peer_id)], dead_after_s=DEAD_AFTER_S)
        keeper.serve()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(keeper.run)
            while not rpc.dialer.connected(info.peer_id):
                await trio.sleep(0.05)
            print("digest", digest.hex(), flush=True)
            print("address", full_addresses(host)[0], flush=True)


async def audit(digest: str, home_address: str, forwarder_address: str) -> None:
    async with running_host(new_identity(), EVERY_INTERFACE) as host:
        rpc = RequestResponse(host)
        peers = [home_address, forwarder_address]
        reachable, _ = await connect_peers(host, peers, 2.0)
        home = node_address_of_peer(peer_info(home_address).peer_id).lower()
        data_node = node_address_of_peer(peer_info(forwarder_address).peer_id).lower()
        source = evidence_source(rpc, peers, reachable, {data_node}, 1, 5.0)
        frame = await source.frame(0, bytes.fromhex(digest), [home])
        print("reached", " ".join(sorted(reachable)) == data_node, flush=True)
        print("missing" if frame is None else f"fetched {len(frame)} bytes", flush=True)


def main() -> None:
    if sys.argv[1] == "public":
        trio.run(public)
    elif sys.argv[1] == "home":
        trio.run(home, sys.argv[2])
    elif sys.argv[1] == "witness":
        trio.run(witness, int(sys.argv[2]))
    elif sys.argv[1] == "forwarder":
        trio.run(forwarder)
    elif sys.argv[1] == "evidence-home":
        trio.run(evidence_home, sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "audit":
        trio.run(audit, sys.argv[2], sys.argv[3], sys.argv[4])
    elif sys.argv[1] == "node":
        trio.run(node, int(sys.argv[2]), sys.argv[3:])
    elif sys.argv[1] == "check":
        trio.run(check, int(sys.argv[2]), sys.argv[3], sys.argv[4:])
    else:
        trio.run(dial, float(sys.argv[2]), sys.argv[3:])


if __name__ == "__main__":
    main()
