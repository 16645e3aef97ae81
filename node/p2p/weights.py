"""Stage weight download for joiners: chunked, bounded, digest-checked.

A joining relay asks a replica of its stage for a manifest (size, SHA-256, optimizer step) of the
replica's current state file, then fetches it in chunks that name the digest they belong to. The
replica keeps the states named by its last ``KEPT_STATES`` manifests, so a download finishes with
the state its manifest named even when the replica takes a step meanwhile (a joiner of a large
stage would otherwise never finish while the swarm steps faster than it downloads); a chunk of a
state no longer kept is answered ``stale``, never mixed with another. The joiner checks the
digest of what it assembled before loading anything.

Wire format (protocol ``/gwtf/weights/2.0.0``; numbers big-endian):
  request  = kind u8 (1 manifest, 2 chunk) | stage u16 | digest 32 bytes | offset u64
  manifest = status u8 | size u64 | step u64 | digest 32 bytes
  chunk    = status u8 | raw bytes (at most the chunk size)
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Callable
from dataclasses import dataclass

from libp2p.peer.id import ID

from gwtf.errors import ProtocolError
from node.p2p.rpc import RequestResponse, RpcLimits

PROTOCOL_ID = "/gwtf/weights/2.0.0"
CHUNK_BYTES = 1 << 20
#: States kept for downloads in progress: the current one and the one before a step.
KEPT_STATES = 2

_REQUEST = struct.Struct(">BH32sQ")
_MANIFEST = struct.Struct(">BQQ32s")
_MANIFEST_KIND, _CHUNK_KIND = 1, 2
_OK, _NO_SUCH_STAGE, _STALE = 0, 1, 2
_NO_DIGEST = bytes(32)


class WeightDownloadError(ProtocolError):
    """The download of a stage's state failed; another replica may be tried."""


@dataclass(frozen=True)
class StageSnapshot:
    """One stage's serialised state (weights + optimizer + step) as served to joiners."""

    stage: int
    step: int
    blob: bytes

    @property
    def digest(self) -> bytes:
        return hashlib.sha256(self.blob).digest()


SnapshotSource = Callable[[int], StageSnapshot | None]


def serve_weights(rpc: RequestResponse, snapshot_of: SnapshotSource, timeout_s: float) -> None:
    """Answer manifest and chunk requests from ``snapshot_of(stage)`` (None: stage not held)."""
    limits = RpcLimits(_REQUEST.size, CHUNK_BYTES + 1, timeout_s)
    kept: dict[bytes, StageSnapshot] = {}  # by digest, the states the last manifests named

    async def handle(_peer: str, request: bytes) -> bytes:
        if len(request) != _REQUEST.size:
            raise ProtocolError(
                f"weights request of {len(request)} bytes, expected {_REQUEST.size}"
            )
        kind, stage, digest, offset = _REQUEST.unpack(request)
        if kind == _MANIFEST_KIND:
            snapshot = snapshot_of(stage)
            if snapshot is None:
                return _MANIFEST.pack(_NO_SUCH_STAGE, 0, 0, _NO_DIGEST)
            kept.pop(snapshot.digest, None)
            kept[snapshot.digest] = snapshot  # the newest last
            while len(kept) > KEPT_STATES:
                del kept[next(iter(kept))]
            return _MANIFEST.pack(_OK, len(snapshot.blob), snapshot.step, snapshot.digest)
        if kind != _CHUNK_KIND:
            raise ProtocolError(f"unknown weights request kind {kind}")
        snapshot = kept.get(digest)
        if snapshot is None or snapshot.stage != stage:
            return bytes([_STALE])
        if offset > len(snapshot.blob):
            raise ProtocolError(
                f"chunk offset {offset} beyond a state of {len(snapshot.blob)} bytes"
            )
        return bytes([_OK]) + snapshot.blob[offset : offset + CHUNK_BYTES]

    rpc.serve(PROTOCOL_ID, handle, limits)


async def download_stage_state(
    rpc: RequestResponse, peer: ID, stage: int, max_bytes: int, timeout_s: float
) -> StageSnapshot:
    """Fetch ``stage``'s state from ``peer`` and return it once its digest checks out."""
    manifest_limits = RpcLimits(_REQUEST.size, _MANIFEST.size, timeout_s)
    reply = await rpc.request(
        peer, PROTOCOL_ID, _REQUEST.pack(_MANIFEST_KIND, stage, _NO_DIGEST, 0), manifest_limits
    )
    if len(reply) != _MANIFEST.size:
        raise WeightDownloadError(f"peer {peer} sent a malformed weights manifest")
    status, size, step, digest = _MANIFEST.unpack(reply)
    if status != _OK:
        raise WeightDownloadError(f"peer {peer} does not hold stage {stage}; ask another replica")
    if size > max_bytes:
        raise WeightDownloadError(
            f"peer {peer} offers a stage {stage} state of {size} bytes, over the {max_bytes} limit"
        )
    chunk_limits = RpcLimits(_REQUEST.size, CHUNK_BYTES + 1, timeout_s)
    parts: list[bytes] = []
    received = 0
    while received < size:
        request = _REQUEST.pack(_CHUNK_KIND, stage, digest, received)
        chunk = await rpc.request(peer, PROTOCOL_ID, request, chunk_limits)
        if not chunk or chunk[0] != _OK:
            raise WeightDownloadError(
                f"peer {peer}'s stage {stage} state changed during the download; start again"
            )
        body = chunk[1:]
        if not body or received + len(body) > size:
            raise WeightDownloadError(f"peer {peer} sent a chunk that does not fit the manifest")
        parts.append(body)
        received += len(body)
    blob = b"".join(parts)
    if hashlib.sha256(blob).digest() != digest:
        raise WeightDownloadError(f"stage {stage} state from {peer} fails its digest; discarded")
    return StageSnapshot(stage=stage, step=step, blob=blob)
