"""A part's state download: chunked, bounded, digest-checked. Joiners load their stage's state
this way, and ``gwtf-node export`` gathers the weights of every part of a run.

A client asks a node for a manifest (size, SHA-256, optimizer step) of the node's current state
file of a stage (stage 0 is a data node's embedding and head), either the whole state (weights,
AdamW state and step: what a joiner loads) or its weights only (a third of it with AdamW: what an
export needs), then fetches it in chunks that name the digest they belong to. The node keeps the
states named by its last ``KEPT_STATES`` manifests of each kind, so a download finishes with the
state its manifest named even when the node takes a step meanwhile (a joiner of a large stage
would otherwise never finish while the swarm steps faster than it downloads); a chunk of a state
no longer kept is answered ``stale``, never mixed with another. The client checks the digest of
what it assembled before anything uses it.

Peers outside the run are served the weights only, within one shared rate (``PUBLIC_RATE``),
from snapshots at most ``PUBLIC_SNAPSHOT_S`` old that they cannot evict a member's download
from: an exporter is a fresh identity, and the weights are no secret (relays serve their
evidence, weights included, in public for audits). A request over the rate is declined as busy
and asked again after a backoff.

Wire format (protocol ``/gwtf/weights/3.0.0``; numbers big-endian):
  request  = kind u8 (1 state manifest, 2 chunk, 3 weights manifest) | stage u16
             | digest 32 bytes | offset u64
  manifest = status u8 | size u64 | step u64 | digest 32 bytes
  chunk    = status u8 | raw bytes (at most the chunk size)
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Final

import trio
from libp2p.peer.id import ID

from gwtf.errors import ProtocolError
from gwtf.node.p2p.rpc import Decline, PublicRate, RequestDeclined, RequestResponse, RpcLimits

PROTOCOL_ID = "/gwtf/weights/3.0.0"
CHUNK_BYTES = 1 << 20
#: States kept for downloads in progress, per kind: the current one and the one before a step.
KEPT_STATES = 2
#: Requests per second, and burst, answered to all peers outside the run together (1 MiB each).
PUBLIC_RATE: Final = (10.0, 20.0)
#: The oldest weights snapshot a peer outside the run is served, in seconds: outsiders make a
#: node snapshot its part at most this often (a snapshot holds up the part's compute).
PUBLIC_SNAPSHOT_S: Final = 5.0
#: How often a request declined as busy is asked again (after 0.5, 1, 2, 4, 8, 8 ... s).
MAX_BUSY_RETRIES: Final = 8

_REQUEST = struct.Struct(">BH32sQ")
_MANIFEST = struct.Struct(">BQQ32s")
_STATE_KIND, _CHUNK_KIND, _WEIGHTS_KIND = 1, 2, 3
_OK, _NO_SUCH_STAGE, _STALE = 0, 1, 2
_NO_DIGEST = bytes(32)


class WeightDownloadError(ProtocolError):
    """The download of a stage's state failed; another replica may be tried."""


@dataclass(frozen=True)
class StageSnapshot:
    """One stage's serialised state (weights, and unless ``weights_only`` optimizer and step)."""

    stage: int
    step: int
    blob: bytes
    weights_only: bool = False

    @property
    def digest(self) -> bytes:
        return hashlib.sha256(self.blob).digest()


#: ``snapshot_of(stage, weights_only)``: the node's current state of ``stage`` (None: not held).
SnapshotSource = Callable[[int, bool], Awaitable[StageSnapshot | None]]


@dataclass
class _Shelf:
    """The states named by the last ``KEPT_STATES`` manifests of each kind, by digest."""

    kept: dict[bool, dict[bytes, StageSnapshot]] = field(
        default_factory=lambda: {False: {}, True: {}}
    )

    def keep(self, snapshot: StageSnapshot) -> bytes:
        of_kind = self.kept[snapshot.weights_only]
        of_kind.pop(snapshot.digest, None)
        of_kind[snapshot.digest] = snapshot
        while len(of_kind) > KEPT_STATES:
            del of_kind[next(iter(of_kind))]
        return _MANIFEST.pack(_OK, len(snapshot.blob), snapshot.step, snapshot.digest)

    def chunk(self, stage: int, digest: bytes, offset: int) -> bytes:
        snapshot = self.kept[False].get(digest) or self.kept[True].get(digest)
        if snapshot is None or snapshot.stage != stage:
            return bytes([_STALE])
        if offset > len(snapshot.blob):
            raise ProtocolError(
                f"chunk offset {offset} beyond a state of {len(snapshot.blob)} bytes"
            )
        return bytes([_OK]) + snapshot.blob[offset : offset + CHUNK_BYTES]


def serve_weights(
    rpc: RequestResponse,
    snapshot_of: SnapshotSource,
    timeout_s: float,
    public: PublicRate | None = None,
) -> None:
    """Answer manifest and chunk requests from ``snapshot_of``. The run's nodes get either kind
    of state at every step; outsiders, within ``public``, the weights only, from a shelf of
    their own (they cannot push a joiner's state out of the members' one) and snapshotted at
    most every ``PUBLIC_SNAPSHOT_S`` (they cannot make a node take a snapshot at every step)."""
    limits = RpcLimits(_REQUEST.size, CHUNK_BYTES + 1, timeout_s)
    members, outsiders = _Shelf(), _Shelf()
    public_taken: dict[int, tuple[float, StageSnapshot]] = {}  # stage -> (when, snapshot)

    def unpack(request: bytes) -> tuple[int, int, bytes, int]:
        if len(request) != _REQUEST.size:
            raise ProtocolError(
                f"weights request of {len(request)} bytes, expected {_REQUEST.size}"
            )
        kind, stage, digest, offset = _REQUEST.unpack(request)
        if kind not in (_STATE_KIND, _CHUNK_KIND, _WEIGHTS_KIND):
            raise ProtocolError(f"unknown weights request kind {kind}")
        return kind, stage, digest, offset

    async def for_members(_peer: str, request: bytes) -> bytes:
        kind, stage, digest, offset = unpack(request)
        if kind == _CHUNK_KIND:
            return members.chunk(stage, digest, offset)
        snapshot = await snapshot_of(stage, kind == _WEIGHTS_KIND)
        if snapshot is None:
            return _MANIFEST.pack(_NO_SUCH_STAGE, 0, 0, _NO_DIGEST)
        return members.keep(snapshot)

    async def for_outsiders(_peer: str, request: bytes) -> bytes:
        kind, stage, digest, offset = unpack(request)
        if kind == _CHUNK_KIND:
            return outsiders.chunk(stage, digest, offset)
        if kind == _STATE_KIND:
            raise Decline("the whole state is served to the run's nodes; ask for weights only")
        taken = public_taken.get(stage)
        if taken is None or trio.current_time() - taken[0] >= PUBLIC_SNAPSHOT_S:
            snapshot = await snapshot_of(stage, True)
            if snapshot is None:
                return _MANIFEST.pack(_NO_SUCH_STAGE, 0, 0, _NO_DIGEST)
            taken = public_taken[stage] = (trio.current_time(), snapshot)
        return outsiders.keep(taken[1])

    rpc.serve(PROTOCOL_ID, for_members, limits, public or PublicRate(*PUBLIC_RATE), for_outsiders)


@dataclass(frozen=True)
class Manifest:
    """What a node offers of one stage: its state at ``step``, ``size`` bytes."""

    stage: int
    step: int
    size: int
    digest: bytes
    weights_only: bool


async def ask_manifest(
    rpc: RequestResponse, peer: ID, stage: int, timeout_s: float, weights_only: bool = False
) -> Manifest | None:
    """``peer``'s manifest of ``stage`` (None: it does not hold that stage)."""
    kind = _WEIGHTS_KIND if weights_only else _STATE_KIND
    limits = RpcLimits(_REQUEST.size, _MANIFEST.size, timeout_s)
    request = _REQUEST.pack(kind, stage, _NO_DIGEST, 0)
    reply = await _ask(rpc, peer, request, limits)
    if len(reply) != _MANIFEST.size:
        raise WeightDownloadError(f"peer {peer} sent a malformed weights manifest")
    status, size, step, digest = _MANIFEST.unpack(reply)
    if status == _NO_SUCH_STAGE:
        return None
    if status != _OK:
        raise WeightDownloadError(f"peer {peer} answered a manifest with status {status}")
    return Manifest(stage, step, size, digest, weights_only)


async def download_manifest(
    rpc: RequestResponse, peer: ID, manifest: Manifest, max_bytes: int, timeout_s: float
) -> StageSnapshot:
    """Fetch the state ``manifest`` names from ``peer``, once its digest checks out."""
    stage = manifest.stage
    if manifest.size > max_bytes:
        raise WeightDownloadError(
            f"peer {peer} offers a stage {stage} state of {manifest.size} bytes, over the "
            f"{max_bytes} limit"
        )
    # Over a relay a chunk's deadline stretches for its size (``relay_budget``).
    chunk_limits = RpcLimits(_REQUEST.size, CHUNK_BYTES + 1, timeout_s, CHUNK_BYTES)
    parts: list[bytes] = []
    received = 0
    while received < manifest.size:
        request = _REQUEST.pack(_CHUNK_KIND, stage, manifest.digest, received)
        chunk = await _ask(rpc, peer, request, chunk_limits)
        if not chunk or chunk[0] != _OK:
            raise WeightDownloadError(
                f"peer {peer}'s stage {stage} state changed during the download; start again"
            )
        body = chunk[1:]
        if not body or received + len(body) > manifest.size:
            raise WeightDownloadError(f"peer {peer} sent a chunk that does not fit the manifest")
        parts.append(body)
        received += len(body)
    blob = b"".join(parts)
    if hashlib.sha256(blob).digest() != manifest.digest:
        raise WeightDownloadError(
            f"stage {stage} state from {peer} fails its manifest's digest; discarded"
        )
    return StageSnapshot(stage, manifest.step, blob, manifest.weights_only)


async def download_stage_state(
    rpc: RequestResponse,
    peer: ID,
    stage: int,
    max_bytes: int,
    timeout_s: float,
    weights_only: bool = False,
) -> StageSnapshot:
    """Fetch ``stage``'s current state from ``peer`` and return it once its digest checks out."""
    manifest = await ask_manifest(rpc, peer, stage, timeout_s, weights_only)
    if manifest is None:
        raise WeightDownloadError(f"peer {peer} does not hold stage {stage}; ask another replica")
    return await download_manifest(rpc, peer, manifest, max_bytes, timeout_s)


async def _ask(rpc: RequestResponse, peer: ID, request: bytes, limits: RpcLimits) -> bytes:
    """One request; declined as busy (the public rate), it is asked again after a backoff.
    Declined otherwise, it is a ``WeightDownloadError``: another replica may be asked."""
    for busy in range(MAX_BUSY_RETRIES + 1):
        try:
            return await rpc.request(peer, PROTOCOL_ID, request, limits)
        except RequestDeclined as exc:
            if "busy" not in str(exc) or busy == MAX_BUSY_RETRIES:
                raise WeightDownloadError(str(exc)) from exc
            await trio.sleep(min(8.0, 0.5 * 2**busy))
    raise AssertionError("unreachable")
