"""One request passed on to a peer over a connection this node already holds: how a reader
outside the run (an auditor, a juror) reaches a node behind a NAT, which nobody can dial.

A node at home keeps its connections to its data nodes and neighbours up
(``gwtf.node.p2p.keepalive``); each of those serves a *via* protocol beside a protocol of its
own (``/gwtf/evidence-via/1.0.0`` for ``/gwtf/evidence/1.0.0``, ``/gwtf/receipts-via/3.0.0``
for ``/gwtf/receipts/3.0.0``), and answers a request naming a peer with that peer's own answer.
A forwarder never dials for someone else (it declines when it holds no connection), passes on
one request of the inner protocol's fixed size per request, bounds the reply as the inner
protocol does, and answers peers outside the run within the same shared rate as its own
answers. What it passes back is meant to be the target's answer, but a forwarder can change
anything: signed receipts and frames named by their digest are checked as if read directly,
while a status ("not kept") or a state file, which nobody signs, may be made up. Readers hold
neither against the target (``gwtf.node.audit.replays``): a forwarder can withhold, and forge
only what counts against nobody. The target charges a malformed request to whoever sent it, the
forwarder: so the forwarder checks each inner request as the target would and charges its own
requester, or any outsider could have a relay ban its own data node.

A target that gives a seated juror's reads resources of its own (a relay's disk reader,
``gwtf.node.receipts.evidence``) would see a forwarded juror as the forwarder. A forwarder whose
``public.seats`` hold the reader (``gwtf.node.chain.seats``) therefore passes its request on over
a *for* protocol (``/gwtf/evidence-for/1.0.0``), which names that reader; the target serves it to
the run's nodes only, checks the named reader's seat itself, and keys what it gives it by
forwarder and reader both, so a forwarder naming a juror it does not forward for takes nothing
from that juror's own reads. A target that does not speak the *for* protocol (a node of an
older version) gets the request over the plain one, as a member's: the juror is then read on
the shared readers, never refused, for a juror who reads nothing votes the accused's evidence
missing.

Wire format: forwarded request = length u8 | the target's peer id (UTF-8) | the inner request;
its reply is the target's. A *for* request is the same, naming the reader instead of the target.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from libp2p.peer.id import ID

from gwtf.errors import ProtocolError
from gwtf.node.p2p.rpc import (
    Decline,
    PeerTimeout,
    PeerUnavailable,
    PublicRate,
    RequestDeclined,
    RequestResponse,
    RpcLimits,
)

#: The longest peer id a forwarded request may name (a secp256k1 id has 53 characters).
MAX_PEER_ID_CHARS: Final = 64


def forwarded(target: str, request: bytes) -> bytes:
    """``request`` addressed to ``target`` (a peer id) through a forwarder."""
    name = target.encode()
    if not 0 < len(name) <= MAX_PEER_ID_CHARS:
        raise ProtocolError(f"peer id {target[:80]!r} cannot be forwarded to")
    return bytes([len(name)]) + name + request


def forwarded_limits(request_bytes: int, reply_bytes: int, timeout_s: float) -> RpcLimits:
    """The bounds of a forwarded exchange: the inner one's, with room for the target's id and
    for the forwarder's own wait on the target."""
    return RpcLimits(1 + MAX_PEER_ID_CHARS + request_bytes, reply_bytes, 2 * timeout_s)


def for_limits(limits: RpcLimits) -> RpcLimits:
    """The bounds of a *for* exchange: the inner one's, with room for the reader's id."""
    return RpcLimits(
        1 + MAX_PEER_ID_CHARS + limits.max_request_bytes, limits.max_response_bytes,
        limits.timeout_s,
    )  # fmt: skip


def split_forwarded(request: bytes, request_bytes: int, what: str) -> tuple[ID, bytes]:
    """(target, inner request) of a forwarded ``what`` request whose inner part is
    ``request_bytes`` long; ``ProtocolError`` for anything else."""
    length = request[0] if request else 0
    target, inner = request[1 : 1 + length], request[1 + length :]
    if not 0 < length <= MAX_PEER_ID_CHARS or len(inner) != request_bytes:
        raise ProtocolError(f"a forwarded {what} request is (length u8, peer id, request)")
    try:
        return ID.from_base58(target.decode()), inner
    except Exception as exc:  # base58 and multihash raise assorted types for a bad id
        raise ProtocolError(f"a forwarded {what} request names a bad peer id: {exc}") from exc


def serve_forwarding(
    rpc: RequestResponse,
    via_protocol: str,
    protocol: str,
    limits: RpcLimits,
    what: str,
    public: PublicRate | None = None,
    for_protocol: str | None = None,
    check: Callable[[bytes], object] | None = None,
) -> None:
    """Answer ``via_protocol`` by passing each request on to the peer it names over
    ``protocol`` (bounded by ``limits``, the inner protocol's own), over open connections only;
    a reader ``public.seats`` holds over ``for_protocol``, naming it, when given. ``check``
    raises ``ProtocolError`` for an inner request the target would find malformed: the
    requester is charged for it here, and the target never charges this node for another's."""
    public = public or PublicRate()

    async def forward(peer: str, request: bytes) -> bytes:
        target, inner = split_forwarded(request, limits.max_request_bytes, what)
        if check is not None:
            check(inner)
        if not rpc.dialer.connected(target):
            raise Decline(f"not connected to {target}: {what} is forwarded over open connections")
        try:
            if for_protocol is not None and await public.seated(peer):
                try:
                    return await rpc.request(
                        target, for_protocol, forwarded(peer, inner), for_limits(limits)
                    )
                except (RequestDeclined, PeerTimeout):
                    raise
                except PeerUnavailable:
                    pass  # a target that does not speak it (an older node): as a member's
            return await rpc.request(target, protocol, inner, limits)
        except RequestDeclined as exc:
            raise Decline(f"{target} declined: {exc}") from exc  # "busy" stays in the text
        except PeerUnavailable as exc:
            raise Decline(f"{target} did not answer: {exc}") from exc

    outer = forwarded_limits(limits.max_request_bytes, limits.max_response_bytes, limits.timeout_s)
    rpc.serve(via_protocol, forward, outer, public)
