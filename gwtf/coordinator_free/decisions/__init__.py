"""One decision core for the flow's data plane: what a node does with a microbatch's hop.

The flow protocol itself (which flows exist, their next hops, moves, lending's bookkeeping) is one
core already, ``protocol.FlowNode``, driven alike by the live node and the simulator. What a node
does with each microbatch on those flows is decided twice: by the live data plane
(``gwtf/node/runtime/dataplane/``, ``roles/``) and by the simulator's GWTF policy
(``sim/gwtf_policy.py``). This package holds those decisions as pure functions of a node's
view and an event: no I/O, no clock, no randomness of their own (``now`` and a
``random.Random`` come in as arguments). Both sides build the view and carry the decision out;
where a decision is still each side's own, the map says so.

Decision map: each per-hop decision, where the live node (L) and the simulator (S) make it, and
how they differ.

* Next hop of a forward at a relay. L: ``roles/relay.py`` ``_send_forward`` ->
  ``HopSender.next_hop``; S: ``GwtfPolicy.choose_next_hop``. One rule, ``hops.next_hop``: the
  flow's route, else the ranked best next-stage peer, which counts the node's own detours in
  flight to each (``hops.Detours``; both sides count a detour from its send, first or re-send,
  until its ack, its failure or the microbatch given up). S keeps only peers that still announce
  that stage (L's receiver refuses a hop for a stage it left and the sender drops it from its
  view). After the last stage L sends to the microbatch's origin (its embedding ends the
  gradient), S along the flow to any data node (every one holds the data set).
* Forward re-sent after a missed ack. L: ``HopSender.send_forward``; S:
  ``GwtfPolicy.on_forward_timeout``. One rule: the peer is declared dead (L: not when it
  declined the hop alive, it is left out instead), then ``hops.next_hop`` again on the flow's
  route as it stands (a relay's). A data node differs: S's moves the microbatch to another
  free flow (``flows.choose_flow``) and re-sends off any flow only when all are busy; L's keeps
  the microbatch's flow and re-sends off it (``hops.next_hop`` with the flow's route gone).
* A dead hop of a backward. L: ``HopSender._around`` (and ``resume_backward``, which the data
  node's trace asks for); S: ``on_backward_timeout``. One rule, ``repair.plan_hop_repair`` with
  ``hops.stand_in`` (a live replica of the stage from the stalled node's own view, at random;
  S's ``gwtf-oracles`` takes the upstream's ``next_hop`` instead): the node before the dead hop
  re-sends its output to the stand-in, which then takes the gradient. Who asks differs: L's
  stalled node asks the node before the dead hop itself, at once; S models a probe by the data
  node (its latency to both and a 5 s probe timeout) before the re-send. L tries the next
  stand-in when one refuses; S's engine has none refuse.
* Waiting on a stalled microbatch or starting it over. L: ``roles/data.py``
  ``_wait_or_repair`` at each stall deadline; S: ``GwtfPolicy.on_stall`` at each watchdog
  period. One rule, ``repair.keep_waiting``: wait while there is progress, at most
  ``MAX_STALL_DEADLINES`` deadlines. What counts as progress differs with what each side
  knows: L, that its trace found the microbatch alive somewhere or repaired a hop; S, that a
  re-sent or repaired hop is still within its ack deadline.
* A data node's flow for its next microbatch. L: ``roles/flow_pool.py`` ``FlowPool``; S:
  ``GwtfPolicy._free_flow``. One rule, ``flows.choose_flow``: own free flows, cheapest reported
  path first, then lent ones, nearest first hop first. Which flows count as free differs: S
  offers only carried flows whose first hop still announces stage 1; L every own slot not in
  use or lent (one not carried yet goes off-flow at its first hop).
* A data node's first hop. L: ``roles/data.py`` ``_first_hop``, the flow's routed first hop,
  else ``hops.next_hop``'s fallback, waiting while no stage-1 peer is known; S:
  ``_inject_on_flow``, the flow's first hop, and with no flow at all, after 10 periods,
  ``hops.next_hop``'s fallback. When each goes off a flow differs.
* Finding where a late microbatch is. L: ``dataplane/stall_repair.py`` traces the path
  (``Trace``, ``TraceBack``) and resumes at the first gap on a replica of its roster
  (``hops.stand_in``); S has no trace: its engine knows where every hop is, and a hop that an
  acknowledging relay dropped is not modelled.
* Gradients a dead replica held. L: ``dataplane/gradient_redo.py`` asks the relays and redoes
  what ``gradient_redo.plan_redo`` and ``holder_to_drop`` name; S redoes none: they count as
  waste lost with the replica.
* A joiner's stage. L: ``discovery/join_placement.py``; S: ``GwtfPolicy.place_joiner``; both
  ``placement.choose_bottleneck``. Whom they ask differs (L: its bootstrap peers and whom they
  name; S: a sample of 32 members); S places the relays present at the start by one greedy
  (``place_relays``).
* Lending idle flows. L: ``flow_pool.py``; S: ``_lend_idle``, ``_return_idle_loans``; both over
  ``FlowNode.lend_idle`` (whom, and in slot order) and ``return_loan``. When a data node counts
  as having nothing waiting differs: L once every microbatch of its iteration has started, S
  while none of its microbatches is held for want of a flow. L also takes its loans back after
  its own microbatch waited 20 flow ticks (``recall_loans``); S never does.

Microbatch ids are ``int`` on both sides (a live hop header's u64, the simulator's counter; the
wire's ``HopAck`` spells one as ``str``); no decision here takes one: each side keys its own
records by them.
"""

from gwtf.coordinator_free.decisions.flows import (
    FlowKey,
    FreeFlow,
    choose_flow,
    lent_flow,
    own_flow,
)
from gwtf.coordinator_free.decisions.hops import (
    Detours,
    HopView,
    NextPeer,
    Onward,
    hop_view,
    next_hop,
    replicas,
    stand_in,
)
from gwtf.coordinator_free.decisions.repair import (
    MAX_STALL_DEADLINES,
    HopRepair,
    keep_waiting,
    plan_hop_repair,
)

__all__ = [
    "MAX_STALL_DEADLINES",
    "Detours",
    "FlowKey",
    "FreeFlow",
    "HopRepair",
    "HopView",
    "NextPeer",
    "Onward",
    "choose_flow",
    "hop_view",
    "keep_waiting",
    "lent_flow",
    "next_hop",
    "own_flow",
    "plan_hop_repair",
    "replicas",
    "stand_in",
]
