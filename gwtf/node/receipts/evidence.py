"""A relay's kept hop evidence, served to auditors and jurors: ``/gwtf/evidence/1.0.0``.

Two things can be asked of an epoch: a frame by its SHA-256 (a hop's input or output, as its
receipt names it; the relay neighbours of a hop keep the same frames, so a worker that
withholds its own is no obstacle, except for a first stage's forward input and a last stage's
backward input, which only data nodes saw and they keep none) and the relay's stage weights
at an iteration. Both come in chunks of at most ``CHUNK_BYTES``, read from disk ``READERS`` at
a time in worker threads (a seated juror's one at a time on a reader of its own), never a file
whole; the reader checks a frame against the digest it asked for and bounds every total.
Access is that of the receipts: the run's peers freely, anyone else within one shared rate,
except the seated jurors of a case about this node (dialling with their node keys; their seats
read from the court, ``gwtf.node.chain.seats``), each within a rate of its own, so flooding the
shared rate, or the readers as a member, cannot make an honest relay's evidence missing.
``prune_settled_evidence`` deletes each epoch's evidence once the epoch settles on chain.

A relay behind a NAT cannot be dialled by an auditor. Every node with receipts therefore also
forwards evidence requests on ``/gwtf/evidence-via/1.0.0`` to a peer it is connected to right
now (a home relay keeps its connections to its data node up: ``gwtf.node.p2p.keepalive``), and the
auditor asks the nodes it reached (the data nodes) for the relays it could not reach
(``gwtf.node.p2p.forwarding``: only over a connection it already has, one chunk per request,
peers outside the run within the same shared rate as its own evidence). A forwarder passes a
seated juror's request on over ``/gwtf/evidence-for/1.0.0``, naming the juror, which the relay
serves to the run's nodes only: a juror whose seat (about this relay) it reads itself gets a
reader of its own through each forwarder, as it does directly, the jurors one forwarder names
sharing ``FORWARDED_READERS`` reads at once (a member may name any seated juror).

Wire format (numbers big-endian):
  request = run u64 | epoch u64 | kind u8 (1 frame, 2 state) | key 32 bytes | offset u64
            (key: the frame's digest, or the iteration as a u64 in the last 8 bytes)
  reply   = status u8 (0 found, 1 not kept) | total u64 | up to CHUNK_BYTES bytes from offset
  forwarded request = length u8 | the target's peer id (UTF-8) | request (``forwarding``);
            its reply is the target's
  for request = length u8 | the juror's peer id (UTF-8) | request; its reply is a reply
"""

from __future__ import annotations

import functools
import hashlib
import logging
import math
import shutil
import struct
from pathlib import Path
from typing import Final

import trio
from libp2p.peer.id import ID

from gwtf.errors import ChainError, ProtocolError
from gwtf.node.chain.epochs import ChainTime, EpochLedger
from gwtf.node.p2p.forwarding import (
    for_limits,
    forwarded,
    forwarded_limits,
    serve_forwarding,
    split_forwarded,
)
from gwtf.node.p2p.rpc import (
    MAX_SEATS,
    Decline,
    PublicRate,
    RequestDeclined,
    RequestResponse,
    RpcLimits,
    Seats,
)
from gwtf.node.receipts.serving import MAX_BUSY_RETRIES, PUBLIC_RATE
from gwtf.node.store.evidence import EvidenceArchive, parse_run_folder

EVIDENCE_PROTOCOL: Final = "/gwtf/evidence/1.0.0"
EVIDENCE_VIA_PROTOCOL: Final = "/gwtf/evidence-via/1.0.0"
EVIDENCE_FOR_PROTOCOL: Final = "/gwtf/evidence-for/1.0.0"
FRAME, STATE = 1, 2
CHUNK_BYTES: Final = 1 << 20
#: Chunks read from disk at once, whoever asks: the node's threads are not the readers'.
READERS: Final = 2
#: Reads of the seated jurors one forwarder names at once (``/gwtf/evidence-for``), whichever.
FORWARDED_READERS: Final = 4
#: The largest frame or state a reader takes (a frame is bounded by the codec's 256 MiB).
MAX_EVIDENCE_BYTES: Final = 1 << 30
_REQUEST = struct.Struct(">QQB32sQ")
_REPLY = struct.Struct(">BQ")
_FOUND, _NOT_KEPT = 0, 1
#: How long past an epoch's ``settlesAt`` the latest block must be before its evidence goes:
#: longer than a reorg that could bring in a dispute opened just before ``settlesAt``.
SETTLED_MARGIN_S: Final = 900
#: How often the evidence of the node's other runs is looked at (they get no new evidence).
OTHER_RUNS_PERIOD_S: Final = 600.0

log = logging.getLogger(__name__)


class EvidenceMissing(ProtocolError):
    """The peer does not keep what was asked (or never had it)."""


def serve_evidence(
    rpc: RequestResponse,
    archive: EvidenceArchive,
    run_id: int,
    timeout_s: float,
    public: PublicRate | None = None,
    seats: Seats | None = None,
) -> None:
    """Answer ``/gwtf/evidence/1.0.0`` from ``archive``; outsiders ``seats`` holds (the seated
    jurors of a case about this node: ``gwtf.node.chain.seats``) within rates of their own."""

    async def answer(peer: str, request: bytes) -> bytes:
        return await read(request, await readers_of(peer))

    async def answer_for(forwarder: str, request: bytes) -> bytes:
        reader, inner = split_forwarded(request, _REQUEST.size, "evidence")
        limiter = await readers_of(str(reader), forwarder)
        if limiter is readers:
            return await read(inner, readers)
        # The juror's own reader first, then one of its forwarder's: a juror with requests
        # waiting holds none of the forwarder's readers, and a member naming every seated
        # juror takes FORWARDED_READERS threads, not one per seat.
        async with limiter:
            return await read(inner, forwarder_readers_of(forwarder))

    async def read(request: bytes, limiter: trio.CapacityLimiter) -> bytes:
        run, epoch, kind, key, offset = _parsed(request)
        if run != run_id:
            raise Decline(f"this node works on run {run_id}, not {run}")
        if kind == FRAME:
            chunk_of = functools.partial(archive.frame_chunk, epoch, key, offset, CHUNK_BYTES)
        else:
            iteration = int.from_bytes(key, "big")
            chunk_of = functools.partial(archive.state_chunk, epoch, iteration, offset, CHUNK_BYTES)
        chunk = await trio.to_thread.run_sync(chunk_of, limiter=limiter)
        if chunk is None:
            return _REPLY.pack(_NOT_KEPT, 0)
        return _REPLY.pack(_FOUND, chunk.total) + chunk.data

    readers = trio.CapacityLimiter(READERS)
    #: A seated juror's own reader: the run's members are not rate-limited, and one that
    #: kept the shared readers busy would otherwise time out every juror's reads. Keyed by
    #: the forwarder it came through too (None: direct), so a member naming a juror in a
    #: *for* request it does not forward for takes nothing from that juror's own reads.
    juror_readers: dict[tuple[str | None, str], trio.CapacityLimiter] = {}
    forwarder_readers: dict[str, trio.CapacityLimiter] = {}
    public = public or PublicRate(*PUBLIC_RATE)
    public.seats = seats or public.seats

    def forwarder_readers_of(forwarder: str) -> trio.CapacityLimiter:
        if forwarder not in forwarder_readers and len(forwarder_readers) >= MAX_SEATS:
            forwarder_readers.clear()  # forwarders of seats long over
        return forwarder_readers.setdefault(forwarder, trio.CapacityLimiter(FORWARDED_READERS))

    async def readers_of(peer: str, via: str | None = None) -> trio.CapacityLimiter:
        key = (via, peer)
        if public.seats is None or not await public.seats.holds(peer):
            juror_readers.pop(key, None)
            return readers
        if key not in juror_readers and len(juror_readers) >= MAX_SEATS:
            juror_readers.clear()  # seats long over
        return juror_readers.setdefault(key, trio.CapacityLimiter(1))

    limits = _limits(timeout_s)
    rpc.serve(EVIDENCE_PROTOCOL, answer, limits, public)
    # A forwarder's request for a reader it forwards for: the run's nodes only (no ``public``).
    rpc.serve(EVIDENCE_FOR_PROTOCOL, answer_for, for_limits(limits))


def _parsed(request: bytes) -> tuple[int, int, int, bytes, int]:
    """(run, epoch, kind, key, offset) of a well-formed evidence request; ``ProtocolError``
    for anything else (a forwarder checks so too, so that what it passes on is never charged
    to it as malformed)."""
    if len(request) != _REQUEST.size:
        raise ProtocolError("an evidence request is (run u64, epoch u64, kind u8, key 32 "
                            "bytes, offset u64)")  # fmt: skip
    run, epoch, kind, key, offset = _REQUEST.unpack(request)
    if kind not in (FRAME, STATE):
        raise ProtocolError(f"evidence kind {kind} is neither 1 (frame) nor 2 (state)")
    return run, epoch, kind, key, offset


def serve_evidence_forwarding(
    rpc: RequestResponse, timeout_s: float, seats: Seats | None = None
) -> None:
    """Forward ``/gwtf/evidence-via/1.0.0`` requests to connected peers (see the module);
    outsiders ``seats`` holds (seated jurors) within rates of their own."""
    public = PublicRate(*PUBLIC_RATE, seats=seats)
    serve_forwarding(
        rpc, EVIDENCE_VIA_PROTOCOL, EVIDENCE_PROTOCOL, _limits(timeout_s), "evidence", public,
        EVIDENCE_FOR_PROTOCOL, _parsed,
    )  # fmt: skip


async def prune_settled_evidence(
    archive: EvidenceArchive, ledger: EpochLedger, now: ChainTime, period_s: float
) -> None:
    """Every ``period_s``, from the node's start on, delete the evidence of each epoch that has
    settled and whose tensor disputes are all ruled. ``now()`` is the timestamp of the latest
    block the node has seen (never a time run on by the local clock: an epoch counts as settled
    only once a block says so), and an epoch is settled when that is ``SETTLED_MARGIN_S`` past
    its ``settlesAt`` (``RunBook.epochTimes``, the end of its challenge window), the time
    ``Disputes.sol`` stops taking disputes of its hops; the margin outlasts a reorg of the blocks
    around ``settlesAt``, which could bring in a dispute opened just before it. A dispute opened
    before then is ruled by the court's jurors when they have re-executed the hop from this
    evidence (``Disputes.openTensorDisputes``), possibly much later; missing evidence loses a
    dispute. A dispute ruled without a jury may be reopened by its challenger until
    ``Disputes.reopenableUntil(run, epoch)``, so the evidence stays until that has passed too.
    This is the only way an epoch's evidence is deleted, and it goes by the chain's
    own times, not a count of epochs: a node stopped for days prunes everything settled as soon
    as it starts again, and a run that has stopped training is still pruned.

    Every ``OTHER_RUNS_PERIOD_S`` (and at the start) the same is done to the evidence of the
    node's other runs on this chain and ledger, beside this run's folder: a node that left a run
    before it settled has nothing else that would ever delete it. A folder whose run has
    another start time on this chain is another deployment's (a devnet started afresh) and is
    left alone: this chain cannot say when that one settles."""
    last_other_runs = -math.inf
    while True:
        try:
            await trio.to_thread.run_sync(_prune, archive, ledger, now())
            if trio.current_time() - last_other_runs >= OTHER_RUNS_PERIOD_S:
                await trio.to_thread.run_sync(_prune_other_runs, archive.root, ledger, now())
                last_other_runs = trio.current_time()
        except (ChainError, OSError) as exc:
            log.warning("settled evidence not pruned (%s); trying again in %.0f s", exc, period_s)
        await trio.sleep(period_s)


def _prune(archive: EvidenceArchive, ledger: EpochLedger, now: int) -> list[int]:
    disputes = ledger.c.disputes.functions

    def done(epoch: int) -> bool:
        settled = ledger.epoch_times(epoch).settles_at + SETTLED_MARGIN_S <= now
        if not settled or int(disputes.openTensorDisputes(ledger.run_id, epoch).call()) != 0:
            return False
        return int(disputes.reopenableUntil(ledger.run_id, epoch).call()) < now

    return archive.prune_settled(done)


def _prune_other_runs(root: Path, ledger: EpochLedger, now: int) -> None:
    here = parse_run_folder(root.name)
    if here is None:
        return
    runs = None
    for folder in sorted(root.parent.iterdir()):
        other = parse_run_folder(folder.name)
        if (
            other is None
            or folder == root
            or (other.chain_id, other.ledger)
            != (
                here.chain_id,
                here.ledger,
            )
        ):
            continue
        if runs is None:
            runs = int(ledger.c.ledger.functions.runCount().call())
        if not 1 <= other.run_id <= runs:
            continue  # no such run on this chain: another deployment's
        its = EpochLedger(ledger.c, other.run_id, None)
        if its.run_start_and_length()[0] != other.run_start:
            continue
        archive = EvidenceArchive(folder, keep_epochs=1)
        _prune(archive, its, now)
        if not archive.kept_epochs():
            shutil.rmtree(folder, ignore_errors=True)  # a run of the past, pruned whole


async def fetch_frame(
    rpc: RequestResponse,
    peer: str,
    run_id: int,
    epoch: int,
    digest: bytes,
    timeout_s: float,
    via: str | None = None,
) -> bytes:
    """The frame of ``epoch`` whose SHA-256 is ``digest``, from ``peer`` (through the peer
    ``via`` when given: ``/gwtf/evidence-via/1.0.0``); raises ``EvidenceMissing`` when the peer
    does not keep it and ``ProtocolError`` when it sends other bytes."""
    frame = await _fetch(rpc, peer, run_id, epoch, FRAME, digest, timeout_s, via)
    if hashlib.sha256(frame).digest() != digest:
        raise ProtocolError(f"peer {peer} sent a frame that is not {digest.hex()[:16]}…")
    return frame


async def fetch_state(
    rpc: RequestResponse,
    peer: str,
    run_id: int,
    epoch: int,
    iteration: int,
    timeout_s: float,
    via: str | None = None,
) -> bytes:
    """``peer``'s stage state file at ``iteration`` of ``epoch`` (``EvidenceMissing`` when it
    keeps none), through ``via`` when given; what it is worth is the caller's to check
    (against other replicas')."""
    key = iteration.to_bytes(32, "big")
    return await _fetch(rpc, peer, run_id, epoch, STATE, key, timeout_s, via)


async def _fetch(
    rpc: RequestResponse,
    peer: str,
    run_id: int,
    epoch: int,
    kind: int,
    key: bytes,
    timeout_s: float,
    via: str | None = None,
) -> bytes:
    if via is None:
        to, protocol, limits = peer, EVIDENCE_PROTOCOL, _limits(timeout_s)
    else:
        to, protocol, limits = via, EVIDENCE_VIA_PROTOCOL, _forwarded_limits(timeout_s)
    chunks: list[bytes] = []
    offset, total, busy = 0, None, 0
    while total is None or offset < total:
        request = _REQUEST.pack(run_id, epoch, kind, key, offset)
        request = request if via is None else forwarded(peer, request)
        try:
            reply = await rpc.request(ID.from_base58(to), protocol, request, limits)
        except RequestDeclined as exc:
            # Outsiders share one rate: a request declined as busy is asked again after a wait.
            if "busy" not in str(exc) or busy >= MAX_BUSY_RETRIES:
                raise
            await trio.sleep(min(8.0, 0.5 * 2**busy))
            busy += 1
            continue
        busy = 0
        if len(reply) < _REPLY.size:
            raise ProtocolError(f"an evidence reply of {len(reply)} bytes")
        status, size = _REPLY.unpack_from(reply)
        if status == _NOT_KEPT:
            raise EvidenceMissing(f"peer {peer} keeps no such evidence of epoch {epoch}")
        if status != _FOUND or size > MAX_EVIDENCE_BYTES or (total is not None and size != total):
            raise ProtocolError(f"an evidence reply with status {status} and total {size}")
        total = size
        chunk = reply[_REPLY.size :]
        if len(chunk) != min(CHUNK_BYTES, total - offset):
            raise ProtocolError(f"an evidence chunk of {len(chunk)} bytes at offset {offset}")
        chunks.append(chunk)
        offset += len(chunk)
    return b"".join(chunks)


def _limits(timeout_s: float) -> RpcLimits:
    # A chunk is the reply's size: over a relay the deadline stretches for it (8 s at the floor).
    return RpcLimits(_REQUEST.size, _REPLY.size + CHUNK_BYTES, timeout_s, CHUNK_BYTES)


def _forwarded_limits(timeout_s: float) -> RpcLimits:
    inner = _limits(timeout_s)
    return forwarded_limits(inner.max_request_bytes, inner.max_response_bytes, timeout_s)
