"""Gradient averaging among a stage's live replicas at the end of an iteration.

Replicas must apply the *same* average, or they drift apart. Exchanging shares all-to-all cannot
guarantee that when a replica dies halfway (some saw its share, some did not), so one replica
gathers: the leader is the replica with the smallest id among those still believed alive. Every
follower sends its share to the leader; the leader closes the round when all expected shares are
in or its deadline passes, combines them once — gradient sums added in replica-id order, their
microbatch counts added — and answers every follower with that one combined share and the ids it
came from (one share back instead of every share: the reply no longer grows with the replicas).
Each replica then applies the same combined share (``PartTrainer.average_gradients`` divides it by
the total count), so all of them step bit for bit alike, exactly as if each had summed every share
itself in that order. A dead replica is simply missing from the sum. If the leader itself does not
answer, followers drop it and the next smallest id gathers.

Two gatherers must never both complete a round: a follower cut off from the leader alone (the leader
alive, gathering the others) would otherwise turn to itself, gather its own share alone and step on
it while the others step on the leader's average, and the replicas would drift apart for good. So a
replica that gathers after a leader failed it (a *fallback*), or that ends up with no share but its
own while others were expected, first asks the round's other replicas for a result they hold
(``RESULT_PROTOCOL_ID``, the leaders that failed it included; one that follows a leader other than
the asker waits, bounded, for its leader's answer) and adopts it, the earliest gatherer's if
several. Only when none holds one does it combine what it has; a fallback left with its own share
alone then steps alone only if no other replica answered at all, not even with a refusal (the lone
survivor: the others are gone), and otherwise raises ``RoundCutOff``: the others are alive and may
have stepped without it, so its caller must not step but load their state (a relay resyncs, a data
node asks to be taken back in). This is simpler than agreeing on the gatherer beforehand, and every
wait is bounded, so a gatherer dying mid-round costs at most a few round deadlines, never a stall.

An iteration's end may take several rounds (``attempt``): the data node asks again once it has
redone the gradients a replica that died while averaging held (``EndIteration``). Each is its own
round, so a late share of one never lands in the next.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import trio
from libp2p.peer.id import ID

from gwtf.errors import ProtocolError
from gwtf.node.p2p.rpc import (
    Decline,
    PeerUnavailable,
    RequestDeclined,
    RequestRefused,
    RequestResponse,
    RpcLimits,
)
from gwtf.node.runtime.replicas.share_codec import (
    decode_average,
    decode_shares,
    encode_average,
    encode_shares,
)
from gwtf.node.training.codec import CodecLimits
from gwtf.node.training.trainer import GradientShare

log = logging.getLogger(__name__)


def share_bytes(share: GradientShare) -> int:
    """About what ``share`` takes on the wire: its tensors' bytes."""
    return sum(t.numel() * t.element_size() for t in share.gradients.values())


PROTOCOL_ID = "/gwtf/average/3.0.0"
#: Asks a replica for the result it holds of a round: a round header; the reply is
#: ``_NO_RESULT`` or ``_RESULT`` followed by an ``average``.
RESULT_PROTOCOL_ID = "/gwtf/average/result/1.0.0"
_NO_RESULT, _RESULT = b"\x00", b"\x01"
_ROUND = struct.Struct(">HQB")  # stage, iteration, attempt


MAX_OPEN_ROUNDS = 8  # a peer cannot make a replica hold more rounds than this


class RoundCutOff(ProtocolError):
    """This replica could reach neither its round's gatherer nor a result of the round, while
    other replicas answered: it must not step on its own share (they may have stepped without
    it), but load the state of a replica that stepped."""


@dataclass(frozen=True)
class RoundResult:
    """What every replica of a round applies: the shares' combination and whose shares it holds."""

    contributors: tuple[str, ...]
    combined: GradientShare


def combine_shares(gatherer: str, shares: Sequence[GradientShare]) -> RoundResult:
    """Add the shares' gradient sums in replica-id order (in the gatherer's own share's dtypes,
    else the first's) and their microbatch counts. Shares whose tensors do not match that
    share's names and shapes are left out (a replica of another stage, or a broken one)."""
    ordered = sorted(shares, key=lambda share: share.replica_id)
    own = [share for share in ordered if share.replica_id == gatherer]
    reference = (own or ordered)[0].gradients
    shapes = {name: tensor.shape for name, tensor in reference.items()}
    fitting = []
    for share in ordered:
        if {name: t.shape for name, t in share.gradients.items()} == shapes:
            fitting.append(share)
        else:
            log.warning("share of %s does not fit this stage; left out", share.replica_id)
    summed = {name: torch.zeros_like(tensor) for name, tensor in reference.items()}
    for share in fitting:
        for name, total in summed.items():
            total += share.gradients[name].to(total.dtype)
    count = sum(share.microbatch_count for share in fitting)
    return RoundResult(
        tuple(share.replica_id for share in fitting), GradientShare(gatherer, count, summed)
    )


def fits(result: RoundResult, own: GradientShare) -> bool:
    """Whether another replica's result can be applied here: the same tensor names and shapes
    as this replica's own share, and a count that is not negative. What a replica pulls from
    another is otherwise taken on trust, like a share; this keeps a made-up one from failing
    the step (or stepping on tensors of another stage)."""
    shapes = {name: tensor.shape for name, tensor in own.gradients.items()}
    theirs = {name: tensor.shape for name, tensor in result.combined.gradients.items()}
    return theirs == shapes and result.combined.microbatch_count >= 0


@dataclass
class _Round:
    gatherer: str
    expected: frozenset[str] | None = None  # None until this replica itself opens the round
    shares: dict[str, GradientShare] = field(default_factory=dict)
    closed: trio.Event = field(default_factory=trio.Event)
    result: RoundResult | None = None  # None once closed: cut off, this round has no result
    leader: str | None = None  # the gatherer this replica is waiting on, if another

    def add(self, share: GradientShare) -> None:
        if not self.closed.is_set():
            self.shares[share.replica_id] = share
            self.close_if_complete()

    def close_if_complete(self) -> None:
        if self.expected is not None and self.expected <= set(self.shares):
            self.close()

    def settle(self, result: RoundResult) -> None:
        """Close the round with the result another replica gathered."""
        if not self.closed.is_set():
            self.result = result
            self.closed.set()

    def close(self) -> RoundResult:
        if not self.closed.is_set():
            # Closed by this replica after its own share is in, so never empty. Only the
            # replicas the round expects count: any other admitted peer can send a share.
            expected = self.expected
            shares = [
                s for s in self.shares.values() if expected is None or s.replica_id in expected
            ]
            self.result = combine_shares(self.gatherer, shares)
            self.closed.set()
        assert self.result is not None
        return self.result

    def cut_off(self) -> None:
        """Close the round without a result: this replica has none it may step on."""
        self.closed.set()


@dataclass
class GradientAverager:
    """One replica's side of the averaging rounds of its stage."""

    rpc: RequestResponse
    replica_id: str
    codec_limits: CodecLimits
    round_timeout_s: float
    _rounds: dict[tuple[int, int, int], _Round] = field(default_factory=dict)

    def serve(self) -> None:
        # A relayed follower's request waits for the round, which may wait for relayed
        # shares; a direct follower's keeps its own time.
        limits = RpcLimits(
            self.codec_limits.max_bytes,
            self.codec_limits.max_bytes,
            2 * self.round_timeout_s,
            relayed_answer_s=self.rpc.relay_budget.max_transfer_s,
        )
        self.rpc.serve(PROTOCOL_ID, self._handle, limits)
        self.rpc.serve(RESULT_PROTOCOL_ID, self._handle_result, limits)

    async def _handle(self, peer: str, request: bytes) -> bytes:
        if len(request) < _ROUND.size:
            raise ProtocolError("averaging request shorter than its header")
        key = _ROUND.unpack_from(request)
        shares = decode_shares(request[_ROUND.size :], self.codec_limits)
        if len(shares) != 1 or shares[0].replica_id != peer:
            raise ProtocolError(f"peer {peer} sent a share that is not its own")
        round_ = self._rounds.get(key)
        if round_ is None:
            # A follower may finish its iteration before this replica does: keep its share.
            if len(self._rounds) >= MAX_OPEN_ROUNDS:
                raise ProtocolError(f"peer {peer} opens too many averaging rounds")
            round_ = self._rounds[key] = _Round(self.replica_id)
        round_.add(shares[0])
        await round_.closed.wait()
        if round_.result is None:
            raise Decline("this replica was cut off from the round and holds no result of it")
        return encode_average(round_.result.contributors, round_.result.combined, self.codec_limits)

    async def _handle_result(self, peer: str, request: bytes) -> bytes:
        """Answer the result this replica holds of a round, waiting (bounded) for the one its
        leader is to send unless the asker is that leader (which would wait on this answer)."""
        if len(request) != _ROUND.size:
            raise ProtocolError("averaging result request is not a round header")
        round_ = self._rounds.get(_ROUND.unpack(request))  # never opens a round for an asker
        if round_ is None:
            return _NO_RESULT
        if round_.leader != peer:
            with trio.move_on_after(self.round_timeout_s):
                await round_.closed.wait()
        result = round_.result if round_.closed.is_set() else None
        if result is None:
            return _NO_RESULT
        return _RESULT + encode_average(result.contributors, result.combined, self.codec_limits)

    def open_round(
        self, stage: int, iteration: int, replicas: Sequence[str], attempt: int = 0
    ) -> None:
        """Expect the shares of ``replicas`` in this round."""
        round_ = self._rounds.setdefault((stage, iteration, attempt), _Round(self.replica_id))
        if round_.expected is None:
            round_.expected = frozenset(replicas)
            round_.close_if_complete()

    async def average(
        self,
        stage: int,
        iteration: int,
        own: GradientShare,
        replicas: Sequence[str],
        attempt: int = 0,
    ) -> RoundResult:
        """Return the combined share every live replica of ``stage`` applies this iteration."""
        candidates = sorted(set(replicas) | {self.replica_id})
        key = (stage, iteration, attempt)
        self.open_round(stage, iteration, candidates, attempt)
        round_ = self._rounds[key]
        failed: list[str] = []
        try:
            for leader in candidates:
                if leader == self.replica_id:
                    round_.leader = None
                    round_.add(own)
                    wait_s = self.round_timeout_s + self._relayed_wait_s(candidates, own)
                    with trio.move_on_after(wait_s):
                        await round_.closed.wait()
                    return await self._gather(round_, key, candidates, failed, own)
                round_.leader = leader
                try:
                    result = await self._send_to(leader, key, own)
                except PeerUnavailable as exc:
                    log.warning("averaging leader %s of stage %s failed: %s", leader, stage, exc)
                    failed.append(leader)
                    continue
                # A follower the leader died before answering may turn to this replica next:
                # it gets this same result, not a round of its own.
                round_.settle(result)
                return result
            raise AssertionError("unreachable: this replica is always a candidate")
        finally:
            # Keep the latest rounds for late followers; forget older ones and strays.
            for old in [old for old in self._rounds if old[1] < iteration - 1]:
                del self._rounds[old]

    def _relayed_wait_s(self, replicas: Sequence[str], own: GradientShare) -> float:
        """How much longer a gatherer waits for shares coming over a relay: the relay's time
        for a share its size (``relay_budget``, at most its bound), only when every follower
        is reached through a relay alone. A direct follower waits its own time (twice the
        round) and no more, so with one in the round the gatherer closes at its usual time,
        and a relayed share slower than that misses the round (its follower logs it)."""
        others = [r for r in replicas if r != self.replica_id]
        if not others:
            return 0.0
        size = share_bytes(own)
        if not all(self.rpc.relayed.reached_by_relay_only(r) for r in others):
            return 0.0
        return self.rpc.relay_budget.stretch_s(size)

    async def _gather(
        self,
        round_: _Round,
        key: tuple[int, int, int],
        candidates: list[str],
        failed: list[str],
        own: GradientShare,
    ) -> RoundResult:
        """Close ``round_`` as its gatherer, unless another replica holds a result of it."""
        if round_.closed.is_set():
            if round_.result is None:
                raise RoundCutOff(f"averaging round {key} closed without a result")
            return round_.result
        alone = not (set(round_.shares) & (round_.expected or set())) - {self.replica_id}
        # The leaders that failed are asked too: a share's upload can fail (a slow link, a
        # stream reset) where this small question gets through, and a leader alive holds the
        # result the others stepped on.
        others = [c for c in candidates if c != self.replica_id]
        if not (failed or (alone and others)):
            return round_.close()  # the round's first gatherer, with shares besides its own
        answered, results = await self._ask_results(key, others, candidates, own)
        if round_.closed.is_set():  # a leader's answer settled it meanwhile (a late follower's)
            return await self._gather(round_, key, candidates, failed, own)
        if results:
            # Several results only if gatherers already disagreed: the earliest one's wins.
            result = min(results, key=lambda r: candidates.index(r.combined.replica_id))
            round_.settle(result)
            return result
        if failed and alone and answered:
            round_.cut_off()
            raise RoundCutOff(
                f"stage {key[0]}'s averaging round of iteration {key[1]} (attempt {key[2]}): "
                f"cut off from its gatherer {failed[0]}, and none of the {answered} replica(s) "
                "that answered holds the round's result; not stepping alone"
            )
        return round_.close()

    async def _ask_results(
        self, key: tuple[int, int, int], peers: list[str], candidates: list[str], own: GradientShare
    ) -> tuple[int, list[RoundResult]]:
        """Ask ``peers`` at once for a result of the round; how many answered, and the
        results they held that one of the round's ``candidates`` gathered and that fit ``own``."""
        answered = 0
        results: list[RoundResult] = []
        limits = RpcLimits(_ROUND.size, 1 + self.codec_limits.max_bytes, 2 * self.round_timeout_s)

        async def ask(peer: str) -> None:
            nonlocal answered
            try:
                reply = await self.rpc.request(
                    ID.from_base58(peer), RESULT_PROTOCOL_ID, _ROUND.pack(*key), limits
                )
            except (RequestDeclined, RequestRefused) as exc:
                # It is up (it answered, with a refusal): it may have stepped without this one.
                log.info("replica %s refused the averaging result question: %s", peer, exc)
                answered += 1
                return
            except PeerUnavailable as exc:
                log.info("replica %s gave no averaging result: %s", peer, exc)
                return
            answered += 1
            if reply[:1] != _RESULT:
                return
            try:
                contributors, combined = decode_average(reply[1:], self.codec_limits)
            except ProtocolError as exc:
                log.warning("replica %s sent an undecodable averaging result: %s", peer, exc)
                return
            result = RoundResult(contributors, combined)
            if not fits(result, own):
                log.warning(
                    "replica %s sent an averaging result that does not fit this stage", peer
                )
            elif combined.replica_id in candidates:
                results.append(result)

        async with trio.open_nursery() as nursery:
            for peer in peers:
                nursery.start_soon(ask, peer)
        return answered, results

    async def _send_to(
        self, leader: str, key: tuple[int, int, int], own: GradientShare
    ) -> RoundResult:
        request = _ROUND.pack(*key) + encode_shares([own], self.codec_limits)
        # The answer is one combined share, the size of this one: over a relay the deadline
        # stretches for both (at most the relay budget's bound); on a direct connection it is
        # twice the round, whatever the share's size. A share past the budget is still sent,
        # not refused: refused, this replica would turn to the next gatherer, possibly itself,
        # and apply a result of its own while the live leader's replicas apply another.
        timeout_s = 2 * self.round_timeout_s
        limits = RpcLimits(
            len(request), self.codec_limits.max_bytes, timeout_s, len(request),
            send_past_budget=True,
        )  # fmt: skip
        reply = await self.rpc.request(ID.from_base58(leader), PROTOCOL_ID, request, limits)
        try:
            contributors, combined = decode_average(reply, self.codec_limits)
        except ProtocolError as exc:
            raise PeerUnavailable(f"leader {leader} sent an undecodable average: {exc}") from exc
        result = RoundResult(contributors, combined)
        if not fits(result, own):
            raise PeerUnavailable(f"leader {leader} sent an average that does not fit this stage")
        if self.replica_id not in contributors:
            log.warning("leader %s closed stage %s's round without this replica", leader, key[0])
        return result
