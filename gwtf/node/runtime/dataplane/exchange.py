"""Moving activations and gradients between live nodes, one acknowledged hop at a time.

Received hops go into one FIFO compute queue per node; a hop is acknowledged once the receiver has
computed it (the ack names the digest of the tensor received and the attempt), so a sender that
gets no ack before its deadline knows the hop was lost and re-sends it elsewhere. With receipts
on (``gwtf.node.receipts``), a relay signs the receipt of each hop it computed and sends it with
the input's digest, the receiver checks it and countersigns in the ack; a data node notes the
digests of the hops it starts (the anchors its certificate's chains of hops begin at).

A hop whose output its receiver keeps (``FLAG_REPAIR``: a forward recomputed for a gradient to
come; ``FLAG_REDO``: a redone gradient) has no next node to countersign it: its receiver, the
worker, signs its receipt in the ack (the digest of the output kept and its signature), and
the sender, the node the input came from, countersigns and reports it, and hands the worker
the countersignature (``control.Countersigned``), so that the worker holds its receipt whole
too (an auditor or juror asks the worker for it). Its input is the output of a hop the sender
computed (or a data node's own send), so it chains like any other.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

import trio
from libp2p.peer.id import ID

from gwtf.contracts.encoding import Eip712Domain, HopReceipt, hop_key
from gwtf.coordinator_free.wire import HopAck, decode, encode
from gwtf.errors import GwtfError, ProtocolError
from gwtf.node.p2p.rpc import Decline, PeerUnavailable, RequestResponse, RpcLimits
from gwtf.node.receipts.book import HopFacts, ReceiptBook, worker_stage
from gwtf.node.runtime.dataplane import control
from gwtf.node.runtime.dataplane.hop import (
    ATTEMPT_BLOCK,
    BACKWARD,
    FLAG_REDO,
    FLAG_REPAIR,
    FORWARD,
    HopHeader,
    ReceiptInput,
    decode_hop_request,
    encode_hop,
    frame_digest,
)
from gwtf.node.runtime.dataplane.try_token import NO_CHAIN_TRY_DOMAIN, TryTokenError, TryTokens

log = logging.getLogger(__name__)

PROTOCOL_ID = "/gwtf/hop/9.0.0"
#: How long opening the hop stream to a peer may take (a dial: each address within 3 s, or a
#: circuit through a relay), before the ack deadline starts.
OPEN_S = 12.0
_QUEUE_DEPTH = 64
#: Receipts of kept outputs signed and waiting for their countersignature (oldest dropped).
_MAX_KEPT_PENDING = 4096
#: Forwards whose receipt is known whole here (oldest forgotten): a relay's backwards of an
#: iteration come within it, and it holds at most its in-flight microbatches' forwards.
_MAX_FORWARDS_WHOLE = 16384
#: (origin, iteration, microbatch, stage, input digest) of a forward this node computed.
ForwardKey = tuple[str, int, int, int, bytes]


class WrongAck(PeerUnavailable):
    """A hop was answered with an ack that is not its own (malformed, another hop's, another
    tensor's): the peer is up, but its word on this hop is not taken."""


@dataclass
class _Whole:
    """Whether a forward receipt this node signed is whole here, once that is decided: at its
    receiver's ack (a forward sent on), or when its sender hands back the countersignature (a
    kept forward)."""

    decided: trio.Event = field(default_factory=trio.Event)
    whole: bool = False

    def decide(self, whole: bool) -> None:
        self.whole = self.whole or whole
        self.decided.set()


@dataclass(frozen=True)
class Kept:
    """The output of a hop its receiver keeps (a repair's forward, a redone gradient), and
    whether the receiver signs its receipt in the ack."""

    frame: bytes
    receipted: bool = True


class Compute(Protocol):
    """A role's compute of a received hop (its header and frame), run from the node's one
    compute queue, so it may block that queue for as long as the compute takes. Returns the
    output the role keeps (``Kept``), or None (sent on, or a data node's). Raises ``Decline``
    to refuse the hop uncharged, another ``GwtfError`` to reject it (``HopRejected``, charged to
    its sender); nothing else may escape, or the queue stops."""

    async def __call__(self, header: HopHeader, frame: bytes, /) -> Kept | None: ...


class Admit(Protocol):
    """A role's check of a received hop before it joins the compute queue, in the request's
    own task: what waits on another peer (a relay asking a microbatch's origin) must not hold
    up the hops behind it. Returns when the hop may be queued; raises ``Decline`` or another
    ``GwtfError`` to refuse it, as ``Compute`` does."""

    async def __call__(self, header: HopHeader, frame: bytes, /) -> None: ...


class OriginCheck(Protocol):
    """Whether a peer is a data node of the run (``RunAdmission.is_data_node``): True, False,
    or None when that cannot be known now (the chain does not answer). May wait on the chain;
    does not raise."""

    async def __call__(self, peer: str, /) -> bool | None: ...


class OriginSend(Protocol):
    """Told by a data node of each hop it starts (a first forward, a loss gradient) and the
    digest of the frame sent. Must not block: it runs in the send's task."""

    def __call__(self, header: HopHeader, digest: bytes, /) -> None: ...


class HopObserver(Protocol):
    """Sees each hop this node computed whose output was acknowledged (a test's, a tool's
    tally). Must not block or raise: it runs in the data plane's task."""

    def __call__(self, record: HopRecord, /) -> None: ...


class HopRejected(ProtocolError):
    """This node will not compute a hop (wrong run or stage, or the compute failed on its input)."""


class HopRecord(NamedTuple):
    """A hop this node computed whose output the counterparty acknowledged: its facts, and
    whether it was a repair's recomputed forward. A named tuple, as ``HopFacts`` is: one is
    built for every hop acknowledged."""

    hop: HopFacts
    repair: bool


@dataclass
class HopCounts:
    """Hops this node computed whose output the counterparty acknowledged: counted, not kept
    (their receipts are in the node's database), so memory stays flat over a long run. An
    ``observer`` (a test's, a tool's) sees each one."""

    recorded: int = 0
    recomputed: int = 0  # of a re-sent or repaired attempt (attempt > 0)
    observer: HopObserver | None = None

    def record(self, record: HopRecord) -> None:
        self.recorded += 1
        self.recomputed += record.hop.attempt > 0
        if self.observer is not None:
            self.observer(record)


@dataclass
class HopTimings:
    """Where this node's hop time goes (sums in seconds), reported with the node's status."""

    sent: int = 0
    send_to_ack_s: float = 0.0  # a send until its ack: transfer + the receiver's queue + compute
    send_to_ack_max_s: float = 0.0
    in_flight: int = 0  # sends waiting for their ack now
    in_flight_max: int = 0
    computed: int = 0
    queue_wait_s: float = 0.0  # a received hop waiting for the compute queue
    compute_s: float = 0.0  # the role's compute of a received hop (torch + encode)
    queue_depth_max: int = 0
    queue_depth: int = 0  # received hops waiting for compute now
    bytes_sent: int = 0  # hop requests sent (frames with their headers)
    bytes_received: int = 0  # hop requests received

    def sending(self) -> float:
        self.in_flight += 1
        self.in_flight_max = max(self.in_flight_max, self.in_flight)
        return trio.current_time()

    def acked(self, started: float) -> None:
        elapsed = trio.current_time() - started
        self.in_flight -= 1
        self.sent += 1
        self.send_to_ack_s += elapsed
        self.send_to_ack_max_s = max(self.send_to_ack_max_s, elapsed)


@dataclass
class _Job:
    peer: str
    header: HopHeader
    frame: bytes
    done: trio.Event = field(default_factory=trio.Event)
    error: GwtfError | None = None
    kept: Kept | None = None  # the output the role kept (``Compute``)
    queued_at: float = field(default_factory=trio.current_time)


@dataclass
class DataPlane:
    rpc: RequestResponse
    node_id: str
    run_id: int
    stages: int
    ack_deadline_s: float
    max_frame_bytes: int
    compute: Compute | None = None
    admit: Admit | None = None
    #: Below 1, each hop's compute is followed by a wait that stretches it to 1 / speed: the
    #: compute queue is held meanwhile, as a slower GPU would hold it (link emulation's sibling).
    emulated_speed: float = 1.0
    #: A hop's compute lasts at least this long (then 1 / speed of it): a swarm of small
    #: models on one machine then spends its time as GPUs on a big one would, not on its CPUs.
    emulated_hop_s: float = 0.0
    #: This node's receipts; None runs without (no chain, or receipts turned off).
    receipts: ReceiptBook | None = None
    origin_send: OriginSend | None = None
    #: This node's key: a data node signs its tries' tokens with it (``try_token.py``).
    node_key: bytes = field(default=b"", repr=False)
    #: The run's try token domain: its chain and WorkLedger (``try_token.try_token_domain``),
    #: or, for a swarm on no chain, ``NO_CHAIN_TRY_DOMAIN``. The origin signs under it; a
    #: receiver takes only tokens signed under it.
    try_domain: Eip712Domain = NO_CHAIN_TRY_DOMAIN
    #: The try tokens of the forwards received: a forward without a valid one is refused.
    try_tokens: TryTokens = field(init=False)
    #: A forward's origin must be a data node of the run: its try token is the origin's own, so
    #: a run member naming itself the origin would make one up. None (no chain) takes any.
    origins: OriginCheck | None = None
    hops: HopCounts = field(default_factory=HopCounts)
    timings: HopTimings = field(default_factory=HopTimings)
    _queue: tuple[trio.MemorySendChannel[_Job], trio.MemoryReceiveChannel[_Job]] | None = None
    _nursery: trio.Nursery | None = None  # ``serve``'s: background hand-backs
    #: Hops received and not yet computed, by (iteration, microbatch, direction): a trace of a
    #: stalled microbatch must tell a slow node from one that never got the hop.
    _receiving: dict[tuple[int, int, int], int] = field(default_factory=dict)
    #: Hop key -> (origin, receipt, signature) of the kept outputs' receipts this node signed
    #: in an ack, until their sender hands back the countersignature.
    _kept_pending: dict[bytes, tuple[str, HopReceipt, bytes]] = field(default_factory=dict)
    #: (origin, iteration, microbatch, stage, input digest) of the forwards this node computed
    #: whose receipt is whole here (``forward_whole``): set when the receiver's ack brings a
    #: valid countersignature, or, for a kept forward, when its sender hands it back (oldest
    #: forgotten: a backward through it then goes unreceipted, which is safe).
    _forward_whole: dict[ForwardKey, _Whole] = field(default_factory=dict)
    #: (origin, iteration, microbatch, direction) of the kept outputs' receipts signed here.
    _kept_signed: dict[tuple[str, int, int, int], None] = field(default_factory=dict)

    @property
    def open_deadline_s(self) -> float:
        """How long a send may take to open its stream before the ack deadline starts (a first
        hop to a peer behind NAT dials its circuit through a relay first)."""
        return max(OPEN_S, self.ack_deadline_s)

    def __post_init__(self) -> None:
        self.try_tokens = TryTokens(self.try_domain)

    def serve(self, nursery: trio.Nursery) -> None:
        send, receive = trio.open_memory_channel[_Job](_QUEUE_DEPTH)
        self._queue = (send, receive)
        self._nursery = nursery
        limits = RpcLimits(self.max_frame_bytes, 1024, self.ack_deadline_s)
        self.rpc.serve(PROTOCOL_ID, self._handle, limits)
        nursery.start_soon(self._compute_loop, receive)

    async def _handle(self, peer: str, request: bytes) -> bytes:
        self.timings.bytes_received += len(request)
        header, receipted, frame = decode_hop_request(request)
        self._check_sender(peer, header)
        self.try_tokens.check(header)  # a made-up forward is the sender's fault: charged
        if self.origins is not None and header.direction == FORWARD:
            await self._check_origin(header)
        assert self._queue is not None, "serve() starts the queue before any request arrives"
        job = _Job(peer, header, frame)
        key = (header.iteration, header.microbatch_id, header.direction)
        self._receiving[key] = self._receiving.get(key, 0) + 1
        try:
            if self.admit is not None:
                try:
                    await self.admit(header, frame)
                except GwtfError as exc:
                    job.error = exc
                    job.done.set()
            if not job.done.is_set():
                await self._queue[0].send(job)
            depth = self._queue[0].statistics().current_buffer_used
            self.timings.queue_depth = depth
            self.timings.queue_depth_max = max(self.timings.queue_depth_max, depth)
            await job.done.wait()
        finally:
            self._receiving[key] -= 1
            if not self._receiving[key]:
                del self._receiving[key]
        if isinstance(job.error, Decline):  # of its kind: a ``NotHere`` tells the sender more
            raise type(job.error)(str(job.error)) from job.error
        if job.error is not None:
            raise HopRejected(str(job.error)) from job.error
        digest = frame_digest(frame)
        countersignature, kept_digest, kept_signature = b"", b"", b""
        if receipted is not None and self.receipts is not None:
            countersignature = await self._countersign(peer, header, receipted, digest)
        if job.kept is not None and job.kept.receipted and self.receipts is not None:
            kept_digest = frame_digest(job.kept.frame)
            kept_signature = await self._sign_kept(peer, header, digest, kept_digest)
        ack = HopAck(
            str(header.microbatch_id),
            header.stage,
            header.direction,
            header.attempt,
            digest,
            countersignature,
            kept_digest if kept_signature else b"",
            kept_signature,
        )
        return encode(ack)

    async def _sign_kept(
        self, peer: str, header: HopHeader, input_digest: bytes, kept_digest: bytes
    ) -> bytes:
        """This node's signature of the receipt of a hop it computed and keeps the output of
        (the sender ``peer`` countersigns it), or b"" (not a relay's hop, or not signed)."""
        assert self.receipts is not None
        if not 1 <= header.stage <= self.stages:
            return b""
        if header.direction == FORWARD and not header.flags & FLAG_REPAIR:
            return b""
        once = (header.origin, header.iteration, header.microbatch_id, header.direction)
        if once in self._kept_signed:
            # One kept receipt per microbatch and direction: a made-up repair sent here uses
            # up at most one hop key of this node's, and its real hop under that key moves to
            # the next attempt (``send``).
            return b""
        try:
            receipt = self.receipts.receipt(
                kept_hop(header, self.node_id, peer, input_digest, kept_digest)
            )
        except ProtocolError as exc:  # an origin that is no node, a field out of range
            self.receipts.refuse(peer, f"hop receipt cannot be built: {exc}")
            return b""
        signature = await self.receipts.sign(receipt)
        if signature is None:
            return b""
        self._kept_signed[once] = None
        while len(self._kept_signed) > _MAX_KEPT_PENDING:
            del self._kept_signed[next(iter(self._kept_signed))]
        self._kept_pending[hop_key(receipt)] = (header.origin, receipt, signature)
        while len(self._kept_pending) > _MAX_KEPT_PENDING:
            del self._kept_pending[next(iter(self._kept_pending))]
        if header.direction == FORWARD:
            self._signed_forward(_forward_key(receipt, header.origin))
        return signature

    async def forward_whole(
        self, forward: HopHeader, stage: int, input_digest: bytes, patience_s: float
    ) -> bool:
        """Whether a receipt this node signed of a forward of ``forward``'s microbatch at
        ``stage`` from the input ``input_digest`` is whole here, countersigned by its receiver,
        waiting up to ``patience_s`` for it (a kept forward's sender hands the countersignature
        back right after the ack, in the background).

        A juror replays a backward with a whole receipt of its worker's forward of the same
        microbatch, from the input the backward went through; a receiver that withholds the
        countersignature (or a forward made up to replace the held one) leaves this node
        without it, and missing evidence loses. So a backward is receipted only through a
        forward whose receipt of that very input is whole; otherwise it is computed
        unreceipted (unpaid, and nothing to slash). Declining it instead would stall the
        microbatch."""
        key = (forward.origin, forward.iteration, forward.microbatch_id, stage, input_digest)
        whole = self._forward_whole.get(key)
        if whole is None:
            return False  # never signed here, or forgotten: not provably whole
        with trio.move_on_after(patience_s):
            await whole.decided.wait()
        return whole.whole

    def _signed_forward(self, key: ForwardKey) -> _Whole:
        """Whether a forward's receipt is whole here, to be decided: from its signing on."""
        whole = self._forward_whole.get(key)
        if whole is None:
            whole = self._forward_whole[key] = _Whole()
            while len(self._forward_whole) > _MAX_FORWARDS_WHOLE:
                del self._forward_whole[next(iter(self._forward_whole))]
        return whole

    def countersigned(self, peer: str, message: control.Countersigned) -> bytes:
        """The sender of a hop whose output this node kept hands back its countersignature:
        the receipt this node signed in its ack is complete here too."""
        try:
            key, counter = bytes.fromhex(message.hop_key), bytes.fromhex(message.signature)
        except ValueError as exc:
            raise ProtocolError("a countersignature that is not hex") from exc
        pending = self._kept_pending.get(key)
        if pending is None or self.receipts is None:
            return control.encode_reply(False, why="no receipt of that hop waits here")
        origin, receipt, signature = pending
        if not self.receipts.acknowledged(peer, origin, receipt, signature, counter):
            return control.encode_reply(False, why="not that receipt's countersignature")
        del self._kept_pending[key]
        if receipt.direction == FORWARD:
            self._signed_forward(_forward_key(receipt, origin)).decide(True)
        return control.encode_reply(True)

    async def _countersign(
        self, peer: str, header: HopHeader, receipted: ReceiptInput, digest: bytes
    ) -> bytes:
        """The countersignature of a receipted hop this node computed, or b"" when refused."""
        assert self.receipts is not None
        if not self.receipts.is_receipted(header.direction, header.stage):
            return b""  # only relays' hops have receipts; a data node's own sends have none
        try:
            receipt = self.receipts.receipt(
                sent_hop(header, peer, self.node_id, receipted.input_digest, digest)
            )
        except ProtocolError as exc:  # an origin that is no node, a field out of range
            self.receipts.refuse(peer, f"hop receipt cannot be built: {exc}")
            return b""
        return await self.receipts.countersign(
            peer, header.origin, receipt, receipted.worker_signature
        )

    def receiving(self, iteration: int, microbatch_id: int, direction: int) -> bool:
        """Whether such a hop is here, waiting for or in compute."""
        return (iteration, microbatch_id, direction) in self._receiving

    def backwards_here(self, iteration: int) -> bool:
        """Whether a backward of ``iteration`` is here, waiting for or in compute."""
        return any(k[0] == iteration and k[2] == BACKWARD for k in self._receiving)

    async def _check_origin(self, header: HopHeader) -> None:
        """Refuse a forward whose origin the chain did not name a data node of the run: no
        honest node sends one (each passes on the origin it received, checked here), so it is
        its sender's fault. Declined, nobody charged, while the chain cannot be asked."""
        assert self.origins is not None
        named = await self.origins(header.origin)
        if named is None:
            raise Decline(
                f"cannot check now whether {header.origin} is a data node of run {self.run_id}; "
                "send the forward again later"
            )
        if not named:
            raise HopRejected(
                f"forward of microbatch {header.microbatch_id} names origin {header.origin}, "
                f"which is no data node of run {self.run_id}: pass on the origin you received"
            )

    def _check_sender(self, peer: str, header: HopHeader) -> None:
        if header.run_id != self.run_id:
            raise HopRejected(f"hop for run {header.run_id}, this node trains run {self.run_id}")
        if header.direction == FORWARD:
            if not header.path or header.path[-1] != peer or len(header.path) != header.stage:
                raise HopRejected("forward hop whose path does not end at its sender")
        else:
            # Backward path: origin, stage 1..S relays, sink. The sender computed stage + 1.
            if len(header.path) != self.stages + 2 or header.path[header.stage + 1] != peer:
                raise HopRejected("backward hop not sent by the next node of its path")

    async def _compute_loop(self, receive: trio.MemoryReceiveChannel[_Job]) -> None:
        assert self.compute is not None, "a role sets compute before serving"
        async for job in receive:
            started = trio.current_time()
            self.timings.queue_wait_s += started - job.queued_at
            try:
                job.kept = await self.compute(job.header, job.frame)
            except GwtfError as exc:
                log.warning(
                    "hop %s of microbatch %s rejected: %s",
                    job.header.stage,
                    job.header.microbatch_id,
                    exc,
                )
                job.error = exc
            if self.emulated_speed < 1.0 or self.emulated_hop_s > 0.0:
                elapsed_s = trio.current_time() - started
                emulated_s = max(elapsed_s, self.emulated_hop_s) / self.emulated_speed
                await trio.sleep(emulated_s - elapsed_s)
            self.timings.computed += 1
            self.timings.compute_s += trio.current_time() - started
            self.timings.queue_depth = receive.statistics().current_buffer_used
            job.done.set()

    async def send(
        self, to: str, header: HopHeader, frame: bytes, input_digest: bytes | None = None
    ) -> bytes:
        """Send one hop and wait for its ack; returns the acknowledged digest. With receipts
        on, this node signs the receipt of a hop it computed (``input_digest`` given: what it
        computed from) before sending it, and the ack brings it back countersigned.

        Raises ``PeerUnavailable`` (or ``PeerTimeout``) when the hop was not acknowledged in time.
        """
        if header.direction == FORWARD and not header.try_start <= header.attempt:
            # Its receiver would refuse it and charge this node (``try_token.py``).
            raise TryTokenError(
                f"forward of microbatch {header.microbatch_id} at attempt {header.attempt} is "
                f"below its try's start {header.try_start}; not sent"
            )
        digest = frame_digest(frame)
        book, receipt, receipted = self.receipts, None, None
        if book is not None and input_digest is not None:
            if book.is_receipted(header.direction, header.stage):
                while True:
                    receipt = book.receipt(sent_hop(header, self.node_id, to, input_digest, digest))
                    conflicts: list[bool] = []
                    signature = await book.sign(receipt, conflicts)
                    if not conflicts or header.attempt % ATTEMPT_BLOCK == ATTEMPT_BLOCK - 1:
                        break
                    # Its hop key holds another receipt (a made-up repair sent here under it
                    # took it first): the hop goes under the next attempt, still paid.
                    header = header.onward(attempt=header.attempt + 1)
                if signature is None:
                    receipt = None
                else:
                    receipted = ReceiptInput(input_digest, signature)
                    if receipt.direction == FORWARD:  # whole or not once acknowledged
                        self._signed_forward(_forward_key(receipt, header.origin))
            elif self.origin_send is not None and header.origin == self.node_id:
                self.origin_send(header, digest)
        payload = encode_hop(header, frame, receipted)
        limits = RpcLimits(len(payload), 1024, self.ack_deadline_s)
        # The ack deadline is the hop's: a first hop to a peer opens its stream first.
        await self.rpc.open(ID.from_base58(to), PROTOCOL_ID, self.open_deadline_s)
        self.timings.bytes_sent += len(payload)
        started = self.timings.sending()
        try:
            reply = await self.rpc.request(ID.from_base58(to), PROTOCOL_ID, payload, limits)
        finally:
            self.timings.acked(started)
        try:
            ack = decode(reply)
        except ProtocolError as exc:
            raise WrongAck(f"peer {to} sent a malformed hop ack") from exc
        expected = (str(header.microbatch_id), header.stage, header.direction, header.attempt)
        if (
            not isinstance(ack, HopAck)
            or (ack.microbatch_id, ack.stage, ack.direction, ack.attempt) != expected
        ):
            raise WrongAck(f"peer {to} acknowledged another hop")
        if ack.digest != digest:
            raise WrongAck(f"peer {to} acknowledged a tensor other than the one sent")
        if book is not None and receipt is not None and receipted is not None:
            whole = book.acknowledged(
                to, header.origin, receipt, receipted.worker_signature, ack.countersignature
            )
            if receipt.direction == FORWARD:
                self._signed_forward(_forward_key(receipt, header.origin)).decide(whole)
        if book is not None and ack.kept_signature:
            await self._countersign_kept(to, header, digest, ack)
        return ack.digest

    async def _countersign_kept(self, to: str, header: HopHeader, sent: bytes, ack: HopAck) -> None:
        """Countersign (and so report) the receipt ``to`` signed in its ack of a hop it keeps
        the output of. Only a hop sent to be kept has one; a worker's signature that does not
        check, or any other, is refused (``ReceiptBook.countersign``) and the hop stays
        acknowledged."""
        assert self.receipts is not None
        if not header.flags & (FLAG_REPAIR | FLAG_REDO) or not 1 <= header.stage <= self.stages:
            self.receipts.refuse(to, "a kept output's receipt signed for a hop sent on")
            return
        if len(ack.kept_digest) != 32:
            self.receipts.refuse(to, "a kept output's receipt without a 32-byte digest")
            return
        hop = kept_hop(header, to, self.node_id, sent, ack.kept_digest)
        try:
            receipt = self.receipts.receipt(hop)
        except ProtocolError as exc:
            self.receipts.refuse(to, f"a kept output's receipt cannot be built: {exc}")
            return
        counter = await self.receipts.countersign(to, header.origin, receipt, ack.kept_signature)
        if not counter:
            return
        message = control.Countersigned(hop_key(receipt).hex(), counter.hex())
        if self._nursery is None:
            await self._hand_back(to, message)
        else:  # a slow worker must not hold up the send (a re-send's requester has a deadline)
            self._nursery.start_soon(self._hand_back, to, message)

    async def _hand_back(self, to: str, message: control.Countersigned) -> None:
        try:
            await control.ask(self.rpc, to, message, self.ack_deadline_s)
        except PeerUnavailable as exc:  # it is reported all the same, by this node
            log.info("countersignature of hop %s not handed back: %s", message.hop_key, exc)


def sent_hop(
    header: HopHeader, worker: str, receiver: str, input_digest: bytes, output_digest: bytes
) -> HopFacts:
    """The hop ``worker`` computed and sent to ``receiver`` under ``header`` (the outgoing
    one, which names the receiver's stage)."""
    stage = worker_stage(header.direction, header.stage)
    return _hop(header, stage, worker, receiver, input_digest, output_digest)


def kept_hop(
    header: HopHeader, worker: str, sender: str, input_digest: bytes, kept_digest: bytes
) -> HopFacts:
    """The hop ``worker`` computed from what ``sender`` sent it and kept the output of: its
    stage is the one the header names (the receiver's own), its counterparty the sender."""
    return _hop(header, header.stage, worker, sender, input_digest, kept_digest)


def _hop(
    header: HopHeader,
    stage: int,
    worker: str,
    counterparty: str,
    input_digest: bytes,
    output_digest: bytes,
) -> HopFacts:
    return HopFacts(
        epoch=header.epoch,
        data_node=header.origin,
        iteration=header.iteration,
        microbatch_id=header.microbatch_id,
        stage=stage,
        direction=header.direction,
        attempt=header.attempt,
        worker=worker,
        counterparty=counterparty,
        input_digest=input_digest,
        output_digest=output_digest,
    )


def _forward_key(receipt: HopReceipt, origin: str) -> ForwardKey:
    """What ``forward_whole`` asks of a forward receipt: its microbatch, stage and input."""
    return (origin, receipt.iteration, receipt.microbatchId, receipt.stage, receipt.inputDigest)


def direction_name(direction: int) -> str:
    return "backward" if direction == BACKWARD else "forward"
