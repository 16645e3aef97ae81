"""Gather a run's parts from its nodes over ``/gwtf/weights/3.0.0``, for ``gwtf-node export``.

The exporter is a libp2p host of its own (a fresh identity: nodes serve weights to peers outside
the run within a shared rate) that dials the peers it is given. The chain says what each may
serve: a data node of the run its embedding and head (stage 0), a member the relay stages, a
slashed node or a stranger nothing. Each is asked for a manifest of the weights of each stage it
may hold; the export takes the newest optimizer step that every stage is offered at (asking
again a few times while the stages disagree: a swarm still training steps its stages one after
another), then downloads each stage's weights from the first node, in the order given, that
offers that step and whose download checks out (SHA-256 against its manifest, then the file's
own content digest).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import trio
from libp2p.peer.id import ID

from gwtf.errors import ProtocolError
from gwtf.node.audit.runner import ask_chain, connect_peers
from gwtf.node.chain.actions import Contracts
from gwtf.node.chain.adapter import NODE_STATUS_SLASHED
from gwtf.node.p2p.host import peer_info, running_host
from gwtf.node.p2p.identity import new_identity
from gwtf.node.p2p.rpc import PeerUnavailable, RequestResponse
from gwtf.node.p2p.weights import (
    PUBLIC_SNAPSHOT_S,
    Manifest,
    WeightDownloadError,
    ask_manifest,
    download_manifest,
)
from gwtf.node.training.checkpoint import PartState, read_part_state
from gwtf.node.training.errors import CheckpointError, ExportError
from gwtf.node.training.partition import PartitionPlan

#: Rounds of manifests while the stages are at different steps, and the pause between two: a
#: node serves an exporter snapshots up to ``PUBLIC_SNAPSHOT_S`` old, so the rounds span that.
MANIFEST_ROUNDS = 3
ROUND_PAUSE_S = PUBLIC_SNAPSHOT_S / 2 + 0.5
#: Replicas of a part downloaded and compared: what one lying node cannot pass off alone.
REPLICAS_COMPARED = 3
#: Bytes a part's weights-only state file may take beyond 8 per parameter (its header).
HEADER_ALLOWANCE_BYTES = 1 << 20


@dataclass(frozen=True)
class Source:
    """A node to fetch from, and the stages the chain lets it serve."""

    node: str  # its checksummed address
    peer_id: str
    stages: tuple[int, ...]


@dataclass
class Gathered:
    """Each stage's part at ``step`` (index = stage, 0 the data part) and the node it came from;
    each peer dialled: "ok" or why it was not used."""

    step: int
    parts: list[tuple[PartState, str]]
    peers: dict[str, str] = field(default_factory=dict)


async def gather_run(
    contracts: Contracts, run_id: int, plan: PartitionPlan, peers: Sequence[str], timeout_s: float
) -> Gathered:
    """Every part of run ``run_id``, split as ``plan``, from the nodes at ``peers`` (multiaddrs
    ending in /p2p/<peer id>)."""
    for address in peers:
        peer_info(address)  # a bad address fails before anything is dialled
    async with running_host(new_identity()) as host:
        rpc = RequestResponse(host)
        reachable, statuses = await connect_peers(host, peers, timeout_s)
        if not reachable:
            why = "; ".join(f"{node}: {status}" for node, status in statuses.items())
            raise PeerUnavailable(f"none of the {len(peers)} peers given answered ({why})")
        checksummed = {node.lower(): node for node in statuses}
        nodes = [checksummed[node] for node in reachable]  # in the order given
        roles = await ask_chain(roles_in_run, contracts, run_id, plan.n_stages, nodes)
        sources = []
        for node, stages_served in roles.items():
            if stages_served:
                sources.append(Source(node, reachable[node.lower()], stages_served))
            else:
                statuses[node] = f"not a node of run {run_id}, or slashed"
        gathered = await gather_parts(rpc, sources, plan, timeout_s, statuses)
    return gathered


def roles_in_run(
    contracts: Contracts, run_id: int, stages: int, nodes: list[str]
) -> dict[str, tuple[int, ...]]:
    """The stages each node (a checksummed address) may serve in the run, as the chain has it
    (blocking web3 calls)."""
    ledger, registry = contracts.ledger.functions, contracts.registry.functions
    now = int(contracts.w3.eth.get_block("latest")["timestamp"])
    roles: dict[str, tuple[int, ...]] = {}
    for node in nodes:
        if registry.bondOf(node).call()[2] == NODE_STATUS_SLASHED:
            roles[node] = ()
        elif ledger.wasDataNodeBefore(run_id, node, now + 1).call():
            roles[node] = (0,)
        elif ledger.wasMemberDuring(run_id, node, 0, now + 1).call():
            roles[node] = tuple(range(1, stages + 1))
        else:
            roles[node] = ()
    return roles


async def gather_parts(
    rpc: RequestResponse,
    sources: Sequence[Source],
    plan: PartitionPlan,
    timeout_s: float,
    statuses: dict[str, str] | None = None,
) -> Gathered:
    """The data part and every stage of ``plan`` at one optimizer step from ``sources``."""
    statuses = {} if statuses is None else statuses
    for round_ in range(MANIFEST_ROUNDS):
        offers = await _offers(rpc, sources, plan.n_stages, timeout_s, statuses)
        missing = [stage for stage, offered in enumerate(offers) if not offered]
        if missing:
            raise ExportError(_missing_message(missing, statuses))
        common = set.intersection(*({m.step for _, m in offered} for offered in offers))
        if common:
            step = max(common)
            break
        if round_ + 1 < MANIFEST_ROUNDS:
            await trio.sleep(ROUND_PAUSE_S)
    else:
        at = "; ".join(
            f"{_stage_name(stage)} at {sorted({m.step for _, m in offered})}"
            for stage, offered in enumerate(offers)
        )
        raise ExportError(
            f"the stages offer no common optimizer step ({at}); export once the run has stopped "
            "stepping, or give a node of each stage that is at the same step"
        )
    parts = []
    for stage, offered in enumerate(offers):
        at_step = [(source, m) for source, m in offered if m.step == step]
        parts.append(await _download(rpc, plan, stage, at_step, timeout_s, statuses))
    return Gathered(step, parts, statuses)


async def _offers(
    rpc: RequestResponse,
    sources: Sequence[Source],
    stages: int,
    timeout_s: float,
    statuses: dict[str, str],
) -> list[list[tuple[Source, Manifest]]]:
    """Per stage 0..``stages``: the manifests of its weights that sources answered."""
    offers: list[list[tuple[Source, Manifest]]] = [[] for _ in range(stages + 1)]
    for source in sources:
        try:
            for stage in source.stages:
                manifest = await ask_manifest(
                    rpc, ID.from_base58(source.peer_id), stage, timeout_s, weights_only=True
                )
                if manifest is not None:
                    offers[stage].append((source, manifest))
        except ProtocolError as exc:
            statuses[source.node] = f"no manifest: {exc}"[:200]
    return offers


async def _download(
    rpc: RequestResponse,
    plan: PartitionPlan,
    stage: int,
    offered: list[tuple[Source, Manifest]],
    timeout_s: float,
    statuses: dict[str, str],
) -> tuple[PartState, str]:
    """The part from the nodes whose downloads are intact, up to ``REPLICAS_COMPARED`` of
    them: replicas at one step hold the same content (they average and step alike), so nodes
    that disagree are an ``ExportError`` naming them, rather than whichever answered first.
    Each node that failed has why in ``statuses``."""
    failures: list[str] = []
    intact: list[tuple[PartState, str]] = []
    for source, manifest in offered:
        if len(intact) == REPLICAS_COMPARED:
            break
        try:
            peer = ID.from_base58(source.peer_id)
            limit = max_state_bytes(plan, stage)
            snapshot = await download_manifest(rpc, peer, manifest, limit, timeout_s)
            state = await trio.to_thread.run_sync(read_part_state, snapshot.blob)
            _check_is_the_stage(state, plan, stage, manifest)
            intact.append((state, source.node))
        except (ProtocolError, CheckpointError) as exc:
            statuses[source.node] = f"{_stage_name(stage)} not taken: {exc}"[:200]
            failures.append(f"{source.node}: {exc}")
    if not intact:
        raise WeightDownloadError(
            f"no node served {_stage_name(stage)} intact ({'; '.join(failures)})"[:600]
        )
    by_digest: dict[str, list[str]] = {}
    for state, node in intact:
        by_digest.setdefault(state.digest, []).append(node)
    if len(by_digest) > 1:
        sides = " against ".join(", ".join(nodes) for nodes in by_digest.values())
        raise ExportError(
            f"the nodes serving {_stage_name(stage)} at step {intact[0][0].step} disagree on "
            f"its weights ({sides}); audit the run, or export from the nodes you trust (--peer)"
        )
    return intact[0]


def max_state_bytes(plan: PartitionPlan, stage: int) -> int:
    """The most a part's weights-only state file may take: 8 bytes a parameter (float64, the
    widest weights a node keeps) and its header."""
    params = plan.data_param_count if stage == 0 else plan.stages[stage - 1].param_count
    return 8 * params + HEADER_ALLOWANCE_BYTES


def _check_is_the_stage(
    state: PartState, plan: PartitionPlan, stage: int, manifest: Manifest
) -> None:
    """Refuse a state that is not what the node offered: another step, model or stage."""
    if state.step != manifest.step:
        raise WeightDownloadError(
            f"a state of step {state.step} under a manifest of step {manifest.step}"
        )
    if state.config != plan.config:
        raise WeightDownloadError(f"a state of another model than the run's ({state.part})")
    span = None if stage == 0 else plan.stages[stage - 1]
    layers = None if span is None else range(span.first_layer, span.end_layer)
    if state.layers != layers:
        raise WeightDownloadError(f"a {state.part} state offered as {_stage_name(stage)}")


def _stage_name(stage: int) -> str:
    return "the data part" if stage == 0 else f"stage {stage}"


def _missing_message(missing: list[int], statuses: dict[str, str]) -> str:
    names = ", ".join(_stage_name(stage) for stage in missing)
    unused = "; ".join(f"{node}: {why}" for node, why in statuses.items() if why != "ok")
    return (
        f"no node given offers {names}; give a node of each stage with --peer"
        + (f" (not used: {unused})" if unused else "")
    )[:600]
