"""Moving activations and gradients between live nodes, one acknowledged hop at a time.

Received hops go into one FIFO compute queue per node; a hop is acknowledged once the receiver has
computed it (the ack names the digest of the tensor received and the attempt), so a sender that
gets no ack before its deadline knows the hop was lost and re-sends it elsewhere. With receipts
on (``gwtf.node.receipts``), a relay records the receipt of each hop it computed before sending
it with the input's digest, and the receiver records the same receipt before its ack; the
worker signs them later in batches its receiver countersigns (``ReceiptBook``). A data node
notes the digests of the hops it starts (the anchors its certificate's chains of hops begin
at).

A hop whose output its receiver keeps (``FLAG_REPAIR``: a forward recomputed for a gradient to
come; ``FLAG_REDO``: a redone gradient) has no next node: its receiver is the hop's worker and
the sender its counterparty. The receiver records its receipt and names the digest of the
output kept in the ack; the sender records it from the ack, and the receiver batches it for the
sender like any hop it computed. Its input is the output of a hop the sender computed (or a
data node's own send), so it chains like any other.

A backward is receipted only through a forward whose receipt of that very input this node
recorded; it joins a batch only once that forward's batch is countersigned (``_Whole``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

import trio
from libp2p.peer.id import ID

from gwtf.contracts.encoding import Eip712Domain, HopReceipt
from gwtf.coordinator_free.wire import HopAck, decode, encode
from gwtf.errors import GwtfError, ProtocolError
from gwtf.node.p2p.rpc import Decline, PeerUnavailable, RequestResponse, RpcLimits
from gwtf.node.receipts.book import HopFacts, address_of_peer, worker_stage
from gwtf.node.receipts.recording import ReceiptBook
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

PROTOCOL_ID = "/gwtf/hop/10.0.0"
#: How long opening the hop stream to a peer may take (a dial: each address within 3 s, or a
#: circuit through a relay), before the ack deadline starts.
OPEN_S = 12.0
_QUEUE_DEPTH = 64
#: Kept outputs' receipts recorded here, one per microbatch and direction (oldest forgotten).
_MAX_KEPT = 4096
#: Forwards whose receipt is recorded here (oldest forgotten): a relay's backwards of an
#: iteration come within it, and it holds at most its in-flight microbatches' forwards.
_MAX_FORWARDS_WHOLE = 16384
#: (data node address, iteration, microbatch, stage, input digest) of a forward this node
#: computed.
ForwardKey = tuple[str, int, int, int, bytes]
#: (origin, iteration, microbatch, stage) of a backward to send -> the forward it goes through.
_BackwardKey = tuple[str, int, int, int]


class WrongAck(PeerUnavailable):
    """A hop was answered with an ack that is not its own (malformed, another hop's, another
    tensor's): the peer is up, but its word on this hop is not taken."""


@dataclass
class _Whole:
    """Whether a forward receipt this node recorded is whole here, once its batch is
    countersigned or withheld; and the backwards through it waiting for that to join a batch."""

    decided: bool = False
    whole: bool = False
    waiting: list[HopReceipt] = field(default_factory=list)

    def decide(self, whole: bool, release: Callable[[HopReceipt], None]) -> None:
        self.whole = self.whole or whole
        self.decided = True
        if self.whole:
            for backward in self.waiting:
                release(backward)
        self.waiting.clear()  # a withheld forward's backwards stay open: unpaid, unsigned


@dataclass(frozen=True)
class Kept:
    """The output of a hop its receiver keeps (a repair's forward, a redone gradient), and
    whether the receiver records its receipt (naming the output's digest in the ack)."""

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
    #: The forwards this node computed whose receipt it recorded, whole or not once their
    #: batch is closed (oldest forgotten: a backward through it then goes unreceipted, which
    #: is safe).
    _forward_whole: dict[ForwardKey, _Whole] = field(default_factory=dict)
    #: The latest of those forwards by (data node, iteration, microbatch, stage): the one a
    #: redone gradient kept here goes through.
    _forward_of: dict[tuple[str, int, int, int], ForwardKey] = field(default_factory=dict)
    #: The forward each backward this relay is about to send goes through (``backward_after``).
    _backward_after: dict[_BackwardKey, ForwardKey] = field(default_factory=dict)
    #: (origin, iteration, microbatch, direction) of the kept outputs' receipts recorded here.
    _kept_signed: dict[tuple[str, int, int, int], None] = field(default_factory=dict)

    @property
    def open_deadline_s(self) -> float:
        """How long a send may take to open its stream before the ack deadline starts (a first
        hop to a peer behind NAT dials its circuit through a relay first)."""
        return max(OPEN_S, self.ack_deadline_s)

    def __post_init__(self) -> None:
        self.try_tokens = TryTokens(self.try_domain)

    def use_receipts(self, book: ReceiptBook) -> None:
        """Record this node's hops in ``book``; its batches decide which forwards are whole."""
        self.receipts = book
        book.on_sealed = self._batch_closed

    def _batch_closed(self, receipts: tuple[HopReceipt, ...], whole: bool) -> None:
        assert self.receipts is not None
        for receipt in receipts:
            if receipt.direction == FORWARD:
                found = self._forward_whole.get(_forward_key(receipt))
                if found is not None:
                    found.decide(whole, self.receipts.release)

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
        kept_digest = b""
        if self.receipts is not None:
            self.receipts.iteration_started(header.iteration)
            # Recorded before the ack: what the batch's countersignature will vouch for is on
            # this node's disk before the worker can rely on it.
            if receipted is not None and not await self._record_received(
                peer, header, receipted, digest
            ):
                # Never an ack of a hop this node holds no receipt of (the batch's close
                # would then wait on it): the worker keeps it held and sends it again.
                raise Decline(
                    f"the receipt of hop {header.microbatch_id} was not recorded here: send "
                    "it again"
                )
            if job.kept is not None and job.kept.receipted:
                kept = frame_digest(job.kept.frame)
                if await self._record_kept(peer, header, digest, kept):
                    kept_digest = kept
        ack = HopAck(
            str(header.microbatch_id),
            header.stage,
            header.direction,
            header.attempt,
            digest,
            kept_digest,
        )
        return encode(ack)

    async def _record_kept(
        self, peer: str, header: HopHeader, input_digest: bytes, kept_digest: bytes
    ) -> bool:
        """Record the receipt of a hop this node computed and keeps the output of (the sender
        ``peer`` records it from the ack); whether it did (not a relay's hop, or refused)."""
        assert self.receipts is not None
        if not 1 <= header.stage <= self.stages:
            return False
        if header.direction == FORWARD and not header.flags & FLAG_REPAIR:
            return False
        once = (header.origin, header.iteration, header.microbatch_id, header.direction)
        if once in self._kept_signed:
            # One kept receipt per microbatch and direction: a made-up repair sent here uses
            # up at most one hop key of this node's, and its real hop under that key moves to
            # the next attempt (``send``).
            return False
        try:
            receipt = self.receipts.receipt(
                kept_hop(header, self.node_id, peer, input_digest, kept_digest)
            )
        except ProtocolError as exc:  # an origin that is no node, a field out of range
            self.receipts.refuse(peer, f"hop receipt cannot be built: {exc}")
            return False
        whole = None
        if header.direction == BACKWARD:
            # A redone gradient goes through this node's own forward of the microbatch: it
            # joins a batch only once that forward is whole, as any backward does.
            forward = self._forward_of.get(
                (receipt.dataNode, header.iteration, header.microbatch_id, header.stage)
            )
            whole = self._forward_whole.get(forward) if forward is not None else None
            if whole is None or (whole.decided and not whole.whole):
                return False
        held = whole is not None
        if not await self.receipts.record(receipt, peer, header.origin, held=held, kept=True):
            return False
        if whole is not None:
            self._acknowledged(self.receipts, receipt, whole)
        self._kept_signed[once] = None
        while len(self._kept_signed) > _MAX_KEPT:
            del self._kept_signed[next(iter(self._kept_signed))]
        if header.direction == FORWARD:
            self._recorded_forward(_forward_key(receipt))
        return True

    def backward_after(self, forward: HopHeader, stage: int, input_digest: bytes) -> bool:
        """Whether this node recorded a receipt of a forward of ``forward``'s microbatch at
        ``stage`` from the input ``input_digest``: then the backward it sends next of that
        microbatch is receipted through it, and joins a batch only once that forward's batch
        is countersigned (a juror replays a backward with a whole receipt of its worker's
        forward from the input the backward went through; without it an honest relay could
        be judged wrong). Otherwise the backward goes unreceipted (unpaid, nothing to slash);
        declining it instead would stall the microbatch."""
        data_node = address_of_peer(forward.origin)
        key = (data_node, forward.iteration, forward.microbatch_id, stage, input_digest)
        if key not in self._forward_whole:
            return False  # never recorded here, or forgotten: not provably whole
        self._backward_after[(forward.origin, forward.iteration, forward.microbatch_id, stage)] = (
            key
        )
        while len(self._backward_after) > _MAX_FORWARDS_WHOLE:
            del self._backward_after[next(iter(self._backward_after))]
        return True

    def _recorded_forward(self, key: ForwardKey) -> _Whole:
        """A forward's receipt recorded here: whole once its batch is countersigned."""
        whole = self._forward_whole.get(key)
        if whole is None:
            whole = self._forward_whole[key] = _Whole()
            self._forward_of[key[:4]] = key
            while len(self._forward_whole) > _MAX_FORWARDS_WHOLE:
                del self._forward_whole[next(iter(self._forward_whole))]
            while len(self._forward_of) > _MAX_FORWARDS_WHOLE:
                del self._forward_of[next(iter(self._forward_of))]
        return whole

    async def _record_received(
        self, peer: str, header: HopHeader, receipted: ReceiptInput, digest: bytes
    ) -> bool:
        """Record the receipt of a receipted hop this node received and computed; whether it
        is on disk (or the hop has none)."""
        assert self.receipts is not None
        if not self.receipts.is_receipted(header.direction, header.stage):
            return True  # only relays' hops have receipts; a data node's own sends have none
        try:
            receipt = self.receipts.receipt(
                sent_hop(header, peer, self.node_id, receipted.input_digest, digest)
            )
        except ProtocolError as exc:  # an origin that is no node, a field out of range
            self.receipts.refuse(peer, f"hop receipt cannot be built: {exc}")
            return False
        return await self.receipts.record(receipt, peer, header.origin)

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
        if self.receipts is not None:
            # Closes and reports go to the origin as spelt: another spelling of its key
            # would send them to a peer id nobody has. An honest node passes on what it got.
            try:
                address_of_peer(header.origin)
            except (ProtocolError, ValueError) as exc:
                raise HopRejected(f"hop origin is not a node's own peer id: {exc}") from exc
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
        on, this node records the receipt of a hop it computed (``input_digest`` given: what
        it computed from) before sending it; a batch signs it later.

        Raises ``PeerUnavailable`` (or ``PeerTimeout``) when the hop was not acknowledged in time.
        """
        if header.direction == FORWARD and not header.try_start <= header.attempt:
            # Its receiver would refuse it and charge this node (``try_token.py``).
            raise TryTokenError(
                f"forward of microbatch {header.microbatch_id} at attempt {header.attempt} is "
                f"below its try's start {header.try_start}; not sent"
            )
        digest = frame_digest(frame)
        book, receipted, recorded = self.receipts, None, None
        if book is not None:
            book.iteration_started(header.iteration)
        if book is not None and input_digest is not None:
            if book.is_receipted(header.direction, header.stage):
                header, recorded = await self._record_sent(book, to, header, input_digest, digest)
                receipted = ReceiptInput(input_digest) if recorded is not None else None
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
        if book is not None and recorded is not None:
            self._acknowledged(book, *recorded)
        if book is not None and ack.kept_digest:
            await self._record_kept_sent(to, header, digest, ack.kept_digest)
        return ack.digest

    def _acknowledged(self, book: ReceiptBook, receipt: HopReceipt, whole: _Whole | None) -> None:
        """A hop whose receipt this node recorded was acknowledged, so its receiver holds the
        receipt too: it may join a batch now (a forward), or once the forward it goes through
        is whole (a backward). An unacknowledged one never does: its receiver, which may not
        hold it, would refuse the whole batch."""
        if receipt.direction == FORWARD:
            book.release(receipt)
        elif whole is not None:
            if not whole.decided:
                whole.waiting.append(receipt)
            elif whole.whole:
                book.release(receipt)

    async def _record_sent(
        self, book: ReceiptBook, to: str, header: HopHeader, input_digest: bytes, digest: bytes
    ) -> tuple[HopHeader, tuple[HopReceipt, _Whole | None] | None]:
        """Record the receipt of a hop this node computed and sends ``to``, held out of
        batches until acknowledged; the header to send it under (a later attempt when its hop
        key holds another receipt) and the receipt with the forward it goes through (a
        backward's), or None (not recorded: unreceipted)."""
        whole = None
        if header.direction == BACKWARD:
            stage = worker_stage(header.direction, header.stage)
            # Kept, not taken: a re-send or redo of this backward goes through it too.
            after = self._backward_after.get(
                (header.origin, header.iteration, header.microbatch_id, stage)
            )
            whole = self._forward_whole.get(after) if after is not None else None
            if whole is None or (whole.decided and not whole.whole):
                return header, None  # no whole forward to replay it with: unreceipted
        while True:
            receipt = book.receipt(sent_hop(header, self.node_id, to, input_digest, digest))
            conflicts: list[bool] = []
            recorded = await book.record(receipt, to, header.origin, conflicts, held=True)
            if not conflicts or header.attempt % ATTEMPT_BLOCK == ATTEMPT_BLOCK - 1:
                break
            # Its hop key holds another receipt (a made-up repair sent here under it took it
            # first): the hop goes under the next attempt, still paid.
            header = header.onward(attempt=header.attempt + 1)
        if not recorded:
            return header, None
        if receipt.direction == FORWARD:
            # Known from now: its receiver may send the backward before this ack arrives.
            self._recorded_forward(_forward_key(receipt))
        return header, (receipt, whole)

    async def _record_kept_sent(
        self, to: str, header: HopHeader, sent: bytes, kept_digest: bytes
    ) -> None:
        """Record the receipt of the hop ``to`` computed from what this node sent and keeps the
        output of (its ack names that output's digest): ``to`` batches it for this node. Only
        a hop sent to be kept has one; any other is refused and the hop stays acknowledged."""
        assert self.receipts is not None
        if not header.flags & (FLAG_REPAIR | FLAG_REDO) or not 1 <= header.stage <= self.stages:
            self.receipts.refuse(to, "a kept output's receipt named for a hop sent on")
            return
        if len(kept_digest) != 32:
            self.receipts.refuse(to, "a kept output's receipt without a 32-byte digest")
            return
        hop = kept_hop(header, to, self.node_id, sent, kept_digest)
        try:
            receipt = self.receipts.receipt(hop)
        except ProtocolError as exc:
            self.receipts.refuse(to, f"a kept output's receipt cannot be built: {exc}")
            return
        await self.receipts.record(receipt, to, header.origin)


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


def _forward_key(receipt: HopReceipt) -> ForwardKey:
    """What ``backward_after`` asks of a forward receipt: its microbatch, stage and input."""
    return (
        receipt.dataNode, receipt.iteration, receipt.microbatchId, receipt.stage,
        receipt.inputDigest,
    )  # fmt: skip


def direction_name(direction: int) -> str:
    return "backward" if direction == BACKWARD else "forward"
