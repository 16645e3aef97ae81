"""One decision core for the flow's data plane: what a node does with a microbatch's hop.

The flow protocol itself (which flows exist, their next hops, moves, lending's bookkeeping) is one
core already, ``protocol.FlowNode``, driven alike by the live node and the simulator. What a node
does with each microbatch on those flows is decided twice: by the live data plane
(``gwtf/node/runtime/dataplane/``, ``roles/``) and by the simulator's GWTF policy
(``sim/gwtf_policy.py``). This package holds those decisions as pure functions of a node's
view and an event: no I/O, no clock, no randomness of their own (``now`` and a
``random.Random`` come in as arguments). Both sides build the view and carry the decision out;
where they still differ, the map says why.

Decision map: each per-hop decision, where the live node (L) and the simulator (S) make it, its
one rule, and what still differs because one side cannot know or do what the other does.

* Next hop of a forward at a relay. L: ``roles/relay.py`` ``_send_forward`` ->
  ``HopSender.next_hop``; S: ``GwtfPolicy.choose_next_hop``. One rule, ``hops.next_hop``: the
  flow's route, else the ranked best next-stage peer, which counts the node's own detours in
  flight to each (``hops.Detours``; both sides count a detour from its send, first or re-send,
  until its ack, its failure or the microbatch given up). Past the last stage, the
  microbatch's origin (``HopView.origin``: its embedding ends the gradient), not the flow's
  sink (in S, 1.6 % slower per seed in the key cell than the cheapest sink, which live would
  need a data node to take another's loss). S keeps only peers that still announce that stage
  (L's receiver refuses a hop for a stage it left and the sender drops it from its view).
* Forward re-sent after a missed ack. L: ``HopSender.send_forward`` (relays and data nodes);
  S: ``GwtfPolicy.on_forward_timeout``. One rule at relays and data nodes alike: the peer is
  declared dead (L: not when it declined the hop alive, it is left out instead), then
  ``hops.next_hop`` again on the microbatch's flow's route as it stands, the peers tried left
  out; a data node keeps the microbatch's flow (busy, named by the hop's slot). Past the last
  stage there is none (only the origin computes the loss): L gives the hop up to the origin's
  trace, S, which has no trace, restarts the microbatch.
* A dead hop of a backward. L: ``HopSender._around`` (and ``resume_backward``, which the data
  node's trace asks for); S: ``on_backward_timeout``. One rule, ``repair.plan_hop_repair`` with
  ``hops.stand_in`` (a live replica of the stage from the stalled node's own view, at random;
  S's ``gwtf-oracles`` takes the upstream's ``next_hop`` instead): the node before the dead hop
  re-sends its output to the stand-in, which then takes the gradient; the stalled node asks it
  itself, at once (S: the latency of that ask). L tries the next stand-in when one refuses;
  S's engine has none refuse.
* Waiting on a stalled microbatch or starting it over. L: ``roles/data.py``
  ``_wait_or_repair`` at each stall deadline; S: ``GwtfPolicy.on_stall`` at each watchdog
  period. One rule, ``repair.keep_waiting``: wait while there is progress, at most
  ``MAX_STALL_DEADLINES`` deadlines. Progress is what each side can see: L, that its trace
  found the microbatch alive somewhere or repaired a hop; S has no trace (its engine holds every
  hop), so a re-sent or repaired hop still within its ack deadline.
* A data node's flow for its next microbatch. L: ``roles/flow_pool.py`` ``FlowPool``; S:
  ``GwtfPolicy._free_flow``. One rule, ``flows.choose_flow``: a free flow is a carried one not
  in use (own slots not lent, then loans); own first, cheapest reported path first, then lent
  ones, nearest first hop first; a slot not carried only once the node carries no flow at all
  and the microbatch has waited ``FLOWLESS_PATIENCE_PERIODS``. S also counts as not carried a
  flow whose first hop came back at another stage (L's receiver would refuse it).
* A data node's first hop. L: ``roles/data.py`` ``_first_hop``; S: ``_inject_on_flow``. One
  rule, ``hops.next_hop`` on the chosen flow's route: its first hop, else (a slot not carried,
  a loan that ended) the ranked best stage-1 peer; while no stage-1 peer is known L waits on the
  flow up to its stall deadline and then restarts, S holds the microbatch on the flow.
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
  ``FlowNode.lend_idle`` (whom, and in slot order) and ``return_loan``. One rule: a data node
  lends, and gives loans back, while none of its microbatches waits for a flow (L: once all of
  its iteration's are started, as it starts them one after another; S: none is held for want of
  one), and takes its lent slots back once its own microbatch waited ``RECALL_PERIODS``
  (``flows.take_back_loans``). A microbatch started over keeps its flow (L: the data node
  retries it there).

Microbatch ids are ``int`` on both sides (a live hop header's u64, the simulator's counter; the
wire's ``HopAck`` spells one as ``str``); no decision here takes one: each side keys its own
records by them.
"""

from gwtf.coordinator_free.decisions.flows import (
    FLOWLESS_PATIENCE_PERIODS,
    RECALL_PERIODS,
    FlowKey,
    FreeFlow,
    choose_flow,
    lent_flow,
    own_flow,
    take_back_loans,
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
    "FLOWLESS_PATIENCE_PERIODS",
    "MAX_STALL_DEADLINES",
    "RECALL_PERIODS",
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
    "take_back_loans",
]
