"""The contract between the simulator's engine and a routing algorithm (GWTF, SWARM, DT-FM, ...).

The engine owns the world: the virtual clock, the event queue, each node's FIFO compute, link
transfers, liveness and churn, the iteration barrier with gradient averaging, weight downloads and
the metrics. A ``RoutingPolicy`` owns every decision: where relays with no stage go, where a joiner
goes, which next-stage node a microbatch goes to at each forward hop, what to do when a hop misses
its deadline, and which control messages nodes exchange. The engine calls the policy; the policy
never calls the engine, it answers with decisions and actions.

Model the engine implements (what a policy may rely on):

* Stages ``1..S`` are held by relays; data nodes are stage 0 (embedding, before stage 1) and also
  the sink after stage S (head and loss). A microbatch's path is
  ``origin data node -> stage 1 -> ... -> stage S -> sink data node`` and its backward retraces the
  same path in reverse, ending at the origin. The sink may be any data node (every data node holds
  the data set); the policy picks it like any other next hop (GWTF picks the origin, as the live
  node must: its embedding ends the gradient).
* Compute: ``compute_ms(node) = stage_compute_ms / speed`` is forward + backward of one
  microbatch; a relay spends 1/3 of it on the forward and 2/3 on the backward (the usual
  backward = 2 x forward rule). A data node spends its whole ``compute_ms`` at the sink (head
  forward, loss, head backward); the embedding's share is folded into that. Each node computes
  one hop at a time, in FIFO order.
* Transfer of activations or gradients (``activation_bytes``) from a to b takes
  ``bytes / bandwidth(a, b)`` on a's uplink, which sends one transfer at a time (FIFO per sender),
  plus the one-way latency. A ``Send`` (control message) takes latency + size/bandwidth and does not
  queue behind activations.
* Acknowledgements: a forward hop a -> b is acknowledged when b has computed its forward (the ack
  reaches a one latency later); a backward hop b -> a likewise when a has computed its backward.
  If the ack has not reached the sender by the policy's deadline, the engine calls
  ``on_forward_timeout`` / ``on_backward_timeout``. A hop sent to a node that is dead, or that dies
  before computing it, is never acknowledged. The engine never tells a surviving node that another
  node crashed: policies learn it from deadlines, except a policy with ``full_knowledge = True``
  (the centralised optimum), which also receives ``on_node_down``.
* Every node buffers the input and output of a hop until the backward through it is done, so a
  forward is re-sent from the sender's buffer (``Forward`` after a forward timeout) and a dead hop
  on the backward is recomputed on a replacement: the replacement receives the input from the
  previous hop's buffer and the gradient from the next hop's buffer, recomputes the forward, then
  the backward (``Replace``). Only that hop is recomputed. ``Restart`` drops the attempt and
  re-injects the microbatch at its origin; everything computed for the attempt counts as wasted.
* Client-routed policies (``client_routed = True``, SWARM as released) change the data plane:
  the origin calls each stage itself. A forward hop is origin -> relay (the origin's uplink),
  and the relay's output comes back to the origin (the relay's uplink; its arrival is the ack)
  before the origin asks ``choose_next_hop`` for the next stage; the loss is computed at the
  origin with no transfer. Relays keep nothing between forward and backward (their slot frees
  when the forward is computed). Each backward is a call from the origin: ``choose_backward_hop``
  names a relay of the stage, which receives the stage's input and its output gradient (two
  transfers on the origin's uplink), recomputes the forward, computes the backward (its whole
  ``compute_ms``) and sends the input gradient back. A missed backward deadline is answered
  like any repair (``Replace`` calls another relay, fed from the origin's buffers).
* Occupancy: a relay holds a microbatch from the admission of its forward until its backward
  through it is done (or the microbatch moved away); ``capacity`` is how many it holds at once.
  A forward that arrives at a full relay waits, outside its memory, and is admitted in arrival
  order when a slot frees (its ack, hence its deadline, includes that wait). A repair is always
  admitted (counted in the metrics when over capacity). A data node injects ``capacity``
  microbatches per iteration (its batch) and has no holding limit as a sink.
* Iteration: ends when every microbatch injected in it has finished its backward at its origin;
  then each stage's live replicas (and the data nodes, for embedding and head) average gradients
  by butterfly all-reduce of ``stage_param_bytes`` (``iterations.butterfly_allreduce_s``); dead
  replicas are dropped, not waited for. Then the
  ``MoveStage`` actions requested so far take effect (the node downloads the new stage's weights
  from its nearest live replica) and the next iteration starts.
  Without the barrier (``iteration_barrier = False``), an origin injects a new microbatch each
  time one of its own finishes, until the run's total is injected; an iteration ends when a global
  batch (the data nodes' capacities summed) of microbatches has finished, and the relays then
  average in place: each live relay's compute is blocked for the all-reduce while origins keep
  sending (their calls queue). ``MoveStage`` actions take effect when the all-reduce is done.
* Wire size: every activation or gradient transfer carries ``activation_bytes`` times the
  policy's ``activation_wire_ratio`` (compression); weight downloads and all-reduces do not.
* Holding: ``Hold`` parks the microbatch at the node. The engine asks ``choose_next_hop`` again
  for parked microbatches when a node of the next stage frees a slot, when any node joins, on
  every ``on_tick`` of the holder, every ``park_retry_s``, and when the policy returns
  ``Retry(node)``; it asks in FIFO order and stops, at that node, at the first answer ``Hold``.
  A ``Hold`` answer to ``on_backward_timeout`` waits one more
  ``backward_timeout_s``. ``on_stall`` may answer ``Restart`` or ``Hold`` (wait again), not
  ``Replace``. If the node that must resend the input of a ``Replace`` is itself dead, the repair
  cannot start: after ``forward_timeout_s`` the engine restarts the microbatch.
* A policy may read from ``WorldView`` only what its nodes could know: static facts (topology,
  model, node profiles and announced stages), its own nodes' occupancy, and messages it was sent.
  ``WorldView.is_alive`` raises unless the policy declares ``full_knowledge``.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Literal, NamedTuple, Protocol

from gwtf.errors import GwtfError

Role = Literal["data", "relay"]
Direction = Literal["forward", "backward"]


class PolicyContractError(GwtfError):
    """A routing policy answered something the engine cannot carry out (a bug in that policy)."""


@dataclass(frozen=True)
class NodeProfile:
    """What a node announces about itself, static for the whole run (its stage is not: see
    ``WorldView.stage_of``). The flow core's ``NodeSpec`` is the identity one ``FlowNode`` runs
    with; a policy builds it from this profile, the current stage and ``compute_ms``.
    """

    node_id: str
    role: Role
    region: str
    speed: float
    capacity: int


class MicrobatchView(NamedTuple):
    """A microbatch as the node handling it sees it (immutable; a tuple, built per decision).

    ``path[k-1]`` is the relay of stage k chosen so far (None where not yet chosen); ``sink`` is the
    data node computing the loss once chosen. ``stage`` is the stage of the node that holds it now
    (0 at the origin, S+1 at the sink). ``attempt`` starts at 0 and grows with each ``Restart``.
    """

    mb_id: int
    origin: str
    iteration: int
    attempt: int
    stage: int
    direction: Direction
    path: tuple[str | None, ...]
    sink: str | None


class HopReport(NamedTuple):
    """An acknowledged hop, as seen by its sender when the acknowledgement arrives (immutable;
    a tuple, built per acknowledgement).

    ``sent_at_s`` is when the transfer was queued at the sender, ``acked_at_s`` when the ack
    arrived: the difference is the hop's response time (queueing, transfer, compute, ack latency).
    """

    mb_id: int
    sender: str
    receiver: str
    stage: int
    direction: Direction
    sent_at_s: float
    acked_at_s: float


# ---- actions a policy returns from callbacks ----


@dataclass(frozen=True, slots=True)
class Send:
    """Control messages from ``src``, each ``(dst, payload, size_bytes)``; each arrives after
    latency + size/bandwidth, or never if its dst is dead. One action carries every message a
    callback sends from one node (a cost advert goes to a dozen peers at once), so a message
    costs the engine one tuple, not an object of its own."""

    src: str
    messages: Sequence[tuple[str, object, int]]


@dataclass(frozen=True)
class MoveStage:
    """Move a relay to ``stage`` at the next iteration boundary (after the all-reduce)."""

    node_id: str
    stage: int


@dataclass(frozen=True)
class Retry:
    """Ask ``choose_next_hop`` again now for every microbatch parked (``Hold``) at ``node_id``."""

    node_id: str


@dataclass(frozen=True, slots=True)
class Wake:
    """Tick ``node_id`` at the first point of its tick grid at or after ``at_s`` (policies with
    ``PolicyTiming.ticks_on_request``). A node has at most one tick pending: an earlier request
    replaces it, a later one is dropped (unless ``postpone``: then it moves the pending tick
    later, except while the node holds parked microbatches), and the policy asks again after
    each tick."""

    node_id: str
    at_s: float
    postpone: bool = False


@dataclass(frozen=True)
class RestartIteration:
    """Every unfinished microbatch of the iteration restarts at its origin (a job relaunched
    from the iteration's start), except ``besides``: the one the decision itself restarts."""

    besides: int | None = None


Action = Send | MoveStage | Retry | Wake | RestartIteration


# ---- decisions about one microbatch ----


@dataclass(frozen=True)
class Forward:
    """Send the forward to ``to``: a node of the next stage, or a data node (sink) after S."""

    to: str
    actions: tuple[Action, ...] = ()


@dataclass(frozen=True)
class Hold:
    """Park the microbatch where it is (the module docstring says when it is asked again)."""

    actions: tuple[Action, ...] = ()


@dataclass(frozen=True)
class Restart:
    """Drop this attempt; the origin re-injects the microbatch (asked ``choose_next_hop`` again)."""

    actions: tuple[Action, ...] = ()


@dataclass(frozen=True)
class Replace:
    """Recompute the dead hop of stage ``stage`` on ``to`` after ``delay_s`` (time the policy's own
    repair protocol takes, e.g. probing the path), then continue the backward from there."""

    stage: int
    to: str
    delay_s: float = 0.0
    actions: tuple[Action, ...] = ()


HopDecision = Forward | Hold | Restart
RepairDecision = Replace | Hold | Restart


@dataclass(frozen=True)
class PolicyTiming:
    """Deadlines and periods a policy runs with (seconds of simulated time).

    ``forward_timeout_s`` / ``backward_timeout_s``: how long a sender waits for a hop's ack.
    ``stall_timeout_s``: the origin's watchdog, one rule for every algorithm: twice its longest
    hop deadline. A microbatch with no progress (a hop computed; time parked at a live node
    counts too) for that long is handed to ``on_stall`` (covers what no hop deadline sees, e.g.
    a parked microbatch whose holder died); shorter would cut hops a deadline still covers.
    ``tick_period_s``: period of ``on_tick`` for every live node, None for no ticks.
    ``park_retry_s``: a parked microbatch is asked about again at least this often.
    ``ticks_on_request``: tick a node only when the policy asked for it with ``Wake`` (and at its
    first tick, and every period while it holds parked microbatches), on the same grid of
    ``tick_period_s`` from a random phase per node; a policy whose idle nodes have nothing to do
    saves their ticks. False: every live node is ticked every period.
    """

    forward_timeout_s: float
    backward_timeout_s: float
    tick_period_s: float | None = None
    park_retry_s: float = 30.0
    ticks_on_request: bool = False

    @property
    def stall_timeout_s(self) -> float:
        return 2.0 * max(self.forward_timeout_s, self.backward_timeout_s)


class WorldView(Protocol):
    """Read-only view of the world the engine hands to every policy callback."""

    @property
    def stages(self) -> int: ...
    @property
    def activation_bytes(self) -> int: ...
    @property
    def stage_param_bytes(self) -> int: ...
    @property
    def iteration(self) -> int:
        """Index of the current iteration (0-based)."""
        ...

    def known_nodes(self) -> Sequence[str]:
        """Nodes that have been up at some time so far, in scenario order (never future joiners)."""
        ...

    def spec(self, node_id: str) -> NodeProfile: ...
    def stage_of(self, node_id: str) -> int | None:
        """The stage the node serves (0 for data nodes), None while a relay has none yet."""
        ...

    def nodes_in_stage(self, stage: int) -> Sequence[str]:
        """Known nodes assigned to ``stage`` whose announcement has not expired: the live ones,
        and the dead for ``world.MEMBERSHIP_EXPIRY_S`` after they last announced (liveness is
        not revealed; a DHT shows no more)."""
        ...

    def announced_at(self, node_id: str) -> float:
        """When the node last announced itself (every ``world.ANNOUNCE_PERIOD_S`` while up)."""
        ...

    def data_nodes(self) -> Sequence[str]: ...
    def compute_ms(self, node_id: str) -> float:
        """Forward + backward time of one microbatch on this node (``stage_compute_ms / speed``)."""
        ...

    def latency_ms(self, src: str, dst: str) -> float: ...
    def bandwidth_gbps(self, src: str, dst: str) -> float: ...
    def edge_cost_ms(self, src: str, dst: str) -> float:
        """The paper's d_ij for one microbatch over the edge src -> dst, forward + backward."""
        ...

    def occupancy(self, node_id: str) -> int:
        """Microbatches the node holds or has waiting for a slot (for the node's own decisions)."""
        ...

    def is_ready(self, node_id: str) -> bool:
        """Whether the node has its stage's weights (False while downloading after a join/move)."""
        ...

    def is_alive(self, node_id: str) -> bool:
        """Liveness; raises ``PolicyContractError`` unless the policy has ``full_knowledge``."""
        ...


class RoutingPolicy(Protocol):
    """A routing algorithm run by the simulator; see the module docstring for the engine's model.

    Callbacks receive ``node_id``: the node on which the decision is taken. Every callback must be
    deterministic given the ``rng`` handed to ``place_initial`` and the calls received.
    """

    name: ClassVar[str]
    full_knowledge: ClassVar[bool]
    #: The data plane "client-routed" (SWARM's): the origin calls every stage itself, so each
    #: forward hop goes origin -> relay -> origin and relays keep no activations; each backward
    #: is a call from the origin, with the stage's input and output gradient, to the relay
    #: ``choose_backward_hop`` names, which recomputes the forward before the backward.
    client_routed: ClassVar[bool]
    #: Whether every origin waits for the whole iteration before injecting again (the engine's
    #: global barrier). False (SWARM as released): each origin injects its next microbatch as
    #: soon as one of its own is done, and an iteration is a global batch of backwards.
    iteration_barrier: bool
    #: Bytes on the wire per byte of activation or gradient (1.0: sent as the model holds them;
    #: 0.5: 8-bit compression of bf16 activations).
    activation_wire_ratio: float

    def timing(self) -> PolicyTiming: ...

    def place_initial(self, world: WorldView, rng: random.Random) -> dict[str, int]:
        """Stage for every relay that starts with ``stage`` null (called once, at time 0)."""
        ...

    def place_joiner(self, world: WorldView, node_id: str, now: float) -> int:
        """Stage for a relay joining (or rejoining) now; it then downloads that stage's weights."""
        ...

    def on_node_up(self, world: WorldView, node_id: str, now: float) -> Sequence[Action]:
        """The node is up (at time 0 for initial nodes, at its join otherwise), on that node."""
        ...

    def on_node_down(self, world: WorldView, node_id: str, now: float) -> Sequence[Action]:
        """Only for ``full_knowledge`` policies: the node crashed now."""
        ...

    def on_iteration_start(self, world: WorldView, iteration: int, now: float) -> Sequence[Action]:
        """A new iteration starts now (its microbatches are injected right after)."""
        ...

    def on_iteration_end(self, world: WorldView, iteration: int, now: float) -> Sequence[Action]:
        """Every microbatch of the iteration is done; the all-reduce starts now."""
        ...

    def choose_next_hop(
        self, world: WorldView, node_id: str, mb: MicrobatchView, now: float
    ) -> HopDecision:
        """``node_id`` holds ``mb`` after its forward (or at injection, at the origin): where next?

        At stage S the answer must be a data node (the sink); before that, a node of stage+1.
        """
        ...

    def choose_backward_hop(
        self, world: WorldView, node_id: str, mb: MicrobatchView, now: float
    ) -> RepairDecision:
        """Client-routed policies only: the origin ``node_id`` has the gradient of stage
        ``mb.stage - 1``'s output; ``Replace(stage, relay)`` calls that relay for the backward."""
        ...

    def on_forward_timeout(
        self, world: WorldView, node_id: str, mb: MicrobatchView, suspect: str, now: float
    ) -> HopDecision:
        """``node_id``'s forward to ``suspect`` missed its deadline; ``Forward`` re-sends the
        buffered output to another node."""
        ...

    def on_backward_timeout(
        self, world: WorldView, node_id: str, mb: MicrobatchView, suspect: str, now: float
    ) -> RepairDecision:
        """``node_id``'s backward to ``suspect`` (stage ``mb.stage - 1``) missed its deadline."""
        ...

    def on_stall(self, world: WorldView, mb: MicrobatchView, now: float) -> RepairDecision:
        """No progress on ``mb`` for ``stall_timeout_s``; decided at its origin."""
        ...

    def on_hop_acked(self, world: WorldView, report: HopReport, now: float) -> Sequence[Action]:
        """An acknowledgement reached ``report.sender``."""
        ...

    def on_microbatch_done(
        self, world: WorldView, mb: MicrobatchView, now: float
    ) -> Sequence[Action]:
        """The backward of ``mb`` reached its origin: the microbatch is complete."""
        ...

    def on_tick(self, world: WorldView, node_id: str, now: float) -> Sequence[Action]:
        """Periodic call on every live node (period ``timing().tick_period_s``)."""
        ...

    def on_message(
        self, world: WorldView, src: str, dst: str, payload: object, now: float
    ) -> Sequence[Action]:
        """A control message (``payload``, as sent in a ``Send``) from ``src`` reached ``dst``."""
        ...


class PolicyDefaults:
    """Base class with do-nothing callbacks, so a policy writes only the decisions it makes."""

    name: ClassVar[str] = "base"
    full_knowledge: ClassVar[bool] = False
    client_routed: ClassVar[bool] = False
    iteration_barrier: bool = True
    activation_wire_ratio: float = 1.0

    def on_node_up(self, world: WorldView, node_id: str, now: float) -> Sequence[Action]:
        return ()

    def on_node_down(self, world: WorldView, node_id: str, now: float) -> Sequence[Action]:
        return ()

    def on_iteration_start(self, world: WorldView, iteration: int, now: float) -> Sequence[Action]:
        return ()

    def on_iteration_end(self, world: WorldView, iteration: int, now: float) -> Sequence[Action]:
        return ()

    def on_stall(self, world: WorldView, mb: MicrobatchView, now: float) -> RepairDecision:
        return Restart()

    def choose_backward_hop(
        self, world: WorldView, node_id: str, mb: MicrobatchView, now: float
    ) -> RepairDecision:
        raise PolicyContractError(f"{self.name} is not client-routed; backwards retrace the path")

    def on_hop_acked(self, world: WorldView, report: HopReport, now: float) -> Sequence[Action]:
        return ()

    def on_microbatch_done(
        self, world: WorldView, mb: MicrobatchView, now: float
    ) -> Sequence[Action]:
        return ()

    def on_tick(self, world: WorldView, node_id: str, now: float) -> Sequence[Action]:
        return ()

    def on_message(
        self, world: WorldView, src: str, dst: str, payload: object, now: float
    ) -> Sequence[Action]:
        return ()
