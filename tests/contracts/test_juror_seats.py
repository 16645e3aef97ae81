"""A seated juror is answered outside the rate all outsiders share: whoever floods an honest
relay's outsider rate through a jury's window cannot make its evidence missing. The juror dials
with its node key; the accused reads the juror's seat from the court (``CourtSeats``), never
from the request; a forwarder (how a juror reaches a relay at home) reads the seats of any case.
A real eth-tester court with a drawn jury, real libp2p hosts on loopback, a relay serving the
evidence of a real stage computation while a fresh peer id floods it or its forwarder.

The juror's busy retries and fetch rounds are cut to one (the real schedule takes minutes of
backoff under a flood): an accused still busy at the end of its schedule counts as missing, so
the same flood convicts an honest relay whose jurors share the outsiders' rate."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from libp2p.peer.peerinfo import info_from_p2p_addr
from multiaddr import Multiaddr

from gwtf.contracts import fraud_proofs
from gwtf.errors import ProtocolError
from gwtf.node.audit import jury as court_jury
from gwtf.node.audit import replays
from gwtf.node.audit.reexecute import Replayer
from gwtf.node.chain import seats as seats_module
from gwtf.node.chain.adapter import Sender
from gwtf.node.chain.seats import CourtSeats
from gwtf.node.p2p.forwarding import forwarded
from gwtf.node.p2p.host import full_address, running_host
from gwtf.node.p2p.identity import identity_from_key, new_identity, peer_id_of
from gwtf.node.p2p.rpc import PublicRate, RequestResponse, RpcLimits
from gwtf.node.receipts import evidence
from gwtf.node.receipts.book import ReceiptTerms
from gwtf.node.receipts.evidence import (
    EVIDENCE_PROTOCOL,
    EVIDENCE_VIA_PROTOCOL,
    FRAME,
    serve_evidence,
    serve_evidence_forwarding,
)
from gwtf.node.receipts.serving import ReceiptServer, serve_receipts_forwarding
from gwtf.node.store.database import open_database
from gwtf.node.store.evidence import EvidenceArchive
from gwtf.node.store.hops import HopStore
from tests.contracts import jury
from tests.contracts.conftest import Staffed
from tests.contracts.test_audit_command import serving_data_node
from tests.contracts.test_dispute_graces import suite_of
from tests.contracts.test_reexecution_audit import SETTINGS, _index, computed_hops
from tests.contracts.world import STAGES, UNITS_PER_HOP, NodeKey
from tests.served import served_in_a_thread

TIMEOUT_S = 5.0
#: The flooded relay's outsider rate: a flood of a few hundred requests a second takes it all.
FLOODED = (1.0, 1.0)


@contextmanager
def flooded_relay(
    s: Staffed,
    relay: NodeKey,
    archive: EvidenceArchive,
    db: Path,
    seated: bool,
    at_home: bool = False,
) -> Iterator[list[str]]:
    """``relay``'s host serving its receipts and evidence to outsiders only (no peer admitted),
    its outsider rate flooded by a fresh peer id all along; ``seated``: it reads its jurors'
    seats from the court. ``at_home``: nothing dials it; a forwarder it keeps connected (and
    admits) forwards to it, and that forwarder's outsider rate is the one flooded (``seated``:
    the forwarder reads the seats of any case). Yields the peers a juror is given."""
    contracts = suite_of(s.w)
    seats = CourtSeats(contracts, relay.address) if seated else None
    terms = ReceiptTerms(s.run, s.w.ledger_domain, STAGES, UNITS_PER_HOP)
    store = HopStore(open_database(f"sqlite:///{db}"))

    @asynccontextmanager
    async def hosts() -> AsyncIterator[list[str]]:
        async with (
            running_host(identity_from_key(relay.private_key)) as host,
            running_host(new_identity()) as forwarder,
            running_host(new_identity()) as flooder,
            trio.open_nursery() as nursery,
        ):

            async def admit(peer: str) -> bool:
                return at_home and peer == str(forwarder.get_id())

            async def outsiders_only(_peer: str) -> bool:
                return False

            rpc = RequestResponse(host, admit=admit)
            ReceiptServer(store, terms).serve(rpc, TIMEOUT_S)
            serve_evidence(rpc, archive, s.run, TIMEOUT_S, PublicRate(*FLOODED), seats)
            request = evidence._REQUEST.pack(0, 0, FRAME, bytes(32), 0)
            if at_home:
                forwarding = RequestResponse(forwarder, admit=outsiders_only)
                anyone_seated = CourtSeats(contracts, None, s.run) if seated else None
                serve_evidence_forwarding(forwarding, TIMEOUT_S, anyone_seated)
                serve_receipts_forwarding(forwarding, TIMEOUT_S, anyone_seated)
                await forwarding.dialer.connect(host.get_id(), host.get_addrs())
                flooded, protocol = full_address(forwarder), EVIDENCE_VIA_PROTOCOL
                request = forwarded(str(host.get_id()), request)
                peers = [flooded, f"/ip4/127.0.0.1/tcp/9/p2p/{host.get_id()}"]  # none listens
            else:
                flooded, protocol = full_address(host), EVIDENCE_PROTOCOL
                peers = [flooded]
            flood = RequestResponse(flooder)
            for _ in range(4):
                nursery.start_soon(_flood, flood, flooded, protocol, request)
            yield peers
            nursery.cancel_scope.cancel()

    with served_in_a_thread(hosts) as peers:
        yield peers


async def _flood(rpc: RequestResponse, address: str, protocol: str, request: bytes) -> None:
    """Send ``request`` to ``address`` as fast as it answers, whatever it answers."""
    info = info_from_p2p_addr(Multiaddr(address))
    await rpc.host.connect(info)
    limits = RpcLimits(1024, 2 << 20, 5.0)
    while True:
        try:
            await rpc.request(info.peer_id, protocol, request, limits)
        except ProtocolError:  # declined busy, a stream reset: flood on
            await trio.sleep(0)


def drawn_case(s: Staffed, tmp_path: Path) -> dict[str, Any]:
    """c's honest hop (microbatch 2) disputed and its first jury drawn in its commit window."""
    w = s.w
    entries, made = computed_hops(s, tmp_path)
    tree = w.certificate_tree(entries)
    cert = w.certify(tree, s.run, 0, s.data)
    w.travel_to(w.epoch_times(s.run, 0)[2] + 1)
    w.mine()
    jurors = jury.seat_jurors(w, 7)
    honest = fraud_proofs.wrong_tensor(cert, tree.leaf_proof(_index(tree, s.c)), entries[2])
    _, case_id = jury.open_case(w, honest)
    jury.reveal_salt(w, case_id, honest)
    seats = set(jury.draw(w, case_id))
    sitting = [j for j in jurors if j.node in seats]
    idle = [j for j in jurors if j.node not in seats]
    return {"tree": tree, "made": made, "sitting": sitting, "idle": idle, "case": case_id}


def juror_pass(
    s: Staffed,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    *,
    seated: bool,
    node_key: str,
    at_home: bool = False,
    in_run: bool = False,
) -> court_jury.Step:
    """One seated juror's pass (``node_key``: dialling with its own node key, "other": with
    an idle juror's, "none": with a fresh peer id) while c's outsider
    rate (or, ``at_home``, its forwarder's) is flooded; its commit."""
    monkeypatch.setattr(evidence, "MAX_BUSY_RETRIES", 1)
    monkeypatch.setattr(replays, "FETCH_ROUNDS", 1)
    case = drawn_case(s, tmp_path)
    juror = case["sitting"][0]
    if in_run:
        s.w.join(s.run, juror.key, juror.wallet)
    keys = {"own": juror.key.private_key, "other": case["idle"][0].key.private_key, "none": None}
    archives: dict[str, EvidenceArchive] = case["made"]["archives"]
    replayer = Replayer(case["made"]["plan"], SETTINGS)
    with (
        serving_data_node(s, s.data, case["tree"], tmp_path / "data.sqlite") as data,
        flooded_relay(s, s.c, archives[s.c.address], tmp_path / "c.sqlite", seated, at_home) as c,
    ):
        steps = trio.run(
            court_jury.serve_once, suite_of(s.w), Sender.unlocked(juror.wallet), [data, *c],
            lambda _run: replayer, TIMEOUT_S, None, keys[node_key],
        )  # fmt: skip
    (step,) = [st for st in steps if st.action in (court_jury.COMMITTED, court_jury.ABSTAINED)]
    return step


def test_a_seated_juror_gets_a_flooded_honest_relays_evidence_and_votes_right(
    staffed: Staffed, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    step = juror_pass(staffed, tmp_path, monkeypatch, seated=True, node_key="own")
    assert step.action == court_jury.COMMITTED, step
    assert step.detail == "right tensor: re-executed: bit-identical", step.detail


def test_a_seated_juror_gets_the_evidence_of_a_relay_at_home_through_a_flooded_forwarder(
    staffed: Staffed, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    step = juror_pass(staffed, tmp_path, monkeypatch, seated=True, node_key="own", at_home=True)
    assert step.action == court_jury.COMMITTED, step
    assert step.detail == "right tensor: re-executed: bit-identical", step.detail


def test_without_seats_the_same_flood_makes_an_honest_relays_evidence_missing(
    staffed: Staffed, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hole seats close: a relay that answers its jurors within the outsiders' rate."""
    step = juror_pass(staffed, tmp_path, monkeypatch, seated=False, node_key="own")
    assert step.action == court_jury.COMMITTED, step
    assert step.detail.startswith("wrong tensor: missing evidence loses"), step.detail


@pytest.mark.parametrize("key", ["none", "other"])
def test_a_juror_dialling_without_its_node_key_shares_the_flooded_rate(
    staffed: Staffed, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, key: str
) -> None:
    """A seat is read from the chain for the peer id's node key, not claimed: a seated juror
    without its key (none, or another node's, which it does not dial with) is an outsider
    like any other, and still votes."""
    step = juror_pass(staffed, tmp_path, monkeypatch, seated=True, node_key=key)
    assert step.detail.startswith("wrong tensor: missing evidence loses"), step.detail


def test_a_juror_whose_node_is_in_the_run_dials_with_a_fresh_identity(
    staffed: Staffed, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its live node keeps connections to the run's nodes: a jury host with the same peer id
    would take them over (py-libp2p keeps one of the two, the newer, and opens the live
    node's streams on it), and the live node would lose its hops. So it is an outsider like
    any other, even with its key given."""
    step = juror_pass(staffed, tmp_path, monkeypatch, seated=True, node_key="own", in_run=True)
    assert step.detail.startswith("wrong tensor: missing evidence loses"), step.detail


def test_the_court_says_who_sits_about_this_node_and_until_when(
    staffed: Staffed, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Seated jurors of a case about c, in their commit window: c admits them, no one else,
    and not a's court reader (a forwarder's, of any case about a node of its run, does; one
    of another run's does not); once their window (and its slack) is over, no one."""
    s, w = staffed, staffed.w
    case = drawn_case(s, tmp_path)
    sitting, idle = case["sitting"], case["idle"]

    def peer(key: NodeKey) -> str:
        return peer_id_of(identity_from_key(key.private_key)).to_base58()

    async def held(about: NodeKey | None, keys: list[NodeKey], run: int = s.run) -> list[bool]:
        if about is None:
            seats = CourtSeats(suite_of(w), None, run)
        else:
            seats = CourtSeats(suite_of(w), about.address)
        return [await seats.holds(peer(key)) for key in keys]

    assert trio.run(held, s.c, [j.key for j in sitting]) == [True] * len(sitting)
    assert trio.run(held, s.c, [j.key for j in idle]) == [False] * len(idle)
    assert trio.run(held, s.a, [j.key for j in sitting]) == [False] * len(sitting)
    # A forwarder's reader: the seated jurors of any case, still no one else.
    assert trio.run(held, None, [j.key for j in sitting]) == [True] * len(sitting)
    assert trio.run(held, None, [j.key for j in idle]) == [False] * len(idle)
    # Another run's forwarder would pass nothing on to c: its seats are none of its concern.
    assert trio.run(held, None, [j.key for j in sitting], s.run + 1) == [False] * len(sitting)
    fresh = peer_id_of(new_identity()).to_base58()
    assert trio.run(CourtSeats(suite_of(w), s.c.address).holds, fresh) is False
    drawn_at = int(jury.rounds(w, case["case"])[-1][2])
    jury.mine_to(w, drawn_at + jury.phase_blocks(w) + seats_module.SLACK_BLOCKS + 2)
    assert trio.run(held, s.c, [j.key for j in sitting]) == [False] * len(sitting)


def test_a_draw_a_reorganisation_took_out_seats_no_one(
    staffed: Staffed, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The chain the reader read a draw from is replaced by one without it (a reorganisation,
    as eth-tester's snapshots make one): its jurors are no longer seated."""
    s, w = staffed, staffed.w
    before_draw: list[Any] = []
    draw = jury.draw

    def draw_after_a_snapshot(world: Any, case_id: int) -> Any:
        before_draw.append(world.tester.take_snapshot())
        return draw(world, case_id)

    monkeypatch.setattr(jury, "draw", draw_after_a_snapshot)
    case = drawn_case(s, tmp_path)
    seats = CourtSeats(suite_of(w), s.c.address)
    keys = [j.key for j in case["sitting"]]

    async def held() -> list[bool]:
        return [await seats.holds(peer_id_of(identity_from_key(k.private_key)).to_base58())
                for k in keys]  # fmt: skip

    assert trio.run(held) == [True] * len(keys)
    w.tester.revert_to_snapshot(before_draw[0])
    w.mine()
    w.mine()
    seats._read_at = -float("inf")  # the next question reads the chain again
    assert trio.run(held) == [False] * len(keys)


def test_a_reader_asked_again_reads_the_chain_at_most_once_a_period(
    staffed: Staffed, tmp_path: Path
) -> None:
    """A flood of made-up peer ids costs the court reader one chain read per period."""
    s = staffed
    reads: list[int] = []
    seats = CourtSeats(suite_of(s.w), s.c.address)
    read = seats._read_chain
    seats._read_chain = lambda: (reads.append(1), read())[1]  # type: ignore[method-assign]

    async def flood() -> None:
        for _ in range(200):
            await seats.holds(peer_id_of(new_identity()).to_base58())

    trio.run(flood)
    assert len(reads) == 1
