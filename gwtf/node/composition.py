"""The composition root: the node's parts built from its settings, and nothing else.

Each function here reads the ``Settings`` sections it needs, refuses a value it cannot run with
(a ``ConfigError`` naming the key and the fix) and returns a ready part: the chain's contracts, the
flow protocol's parameters, the live node's configuration, the chain admission of peers. The
command line and the node's OS process both build through here, so a setting means the same in
every command.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

from libp2p.crypto.keys import KeyPair

from gwtf.contracts.encoding import Eip712Domain, ledger_domain
from gwtf.coordinator_free.protocol.config import DATA, FlowConfig
from gwtf.errors import ConfigError
from gwtf.node.chain.actions import check_run_dataset, open_contracts
from gwtf.node.chain.adapter import RunInfo, Sender
from gwtf.node.chain.epochs import EpochLedger
from gwtf.node.chain.wallet import load_or_create_node_key, open_wallet, resolve_password
from gwtf.node.local_api.server import api_token, bind_api_socket
from gwtf.node.local_api.service import LocalApi
from gwtf.node.p2p.identity import identity_from_key
from gwtf.node.p2p.link_emulation import Topology
from gwtf.node.p2p.relay_service import RelayLimits
from gwtf.node.receipts import ReceiptsConfig
from gwtf.node.receipts.batching import BatchSettings
from gwtf.node.receipts.book import ReceiptTerms
from gwtf.node.receipts.cheats import check_cheat
from gwtf.node.runtime.dataplane.try_token import NO_CHAIN_TRY_DOMAIN, try_token_domain
from gwtf.node.runtime.discovery.admission import RunAdmission
from gwtf.node.runtime.live_node import LiveNodeConfig
from gwtf.node.settings import AUTO_STAGE, Settings
from gwtf.node.training.config import ModelConfig
from gwtf.node.training.errors import ModelConfigError
from gwtf.node.training.partition import model_for_run
from gwtf.node.training.shards import run_vocab

log = logging.getLogger(__name__)
#: Hosts that keep the local API to this machine.
LOOPBACK = ("127.0.0.1", "::1", "localhost")


def node_identity(settings: Settings, password: str | None = None) -> KeyPair:
    """The node key from its keystore (``node.key_file``, created when missing), as the node's
    libp2p identity. The password is ``password`` (``gwtf-node start`` asked for it) or comes
    from ``node.password_file`` or GWTF_WALLET_PASSWORD: a node process never prompts."""
    node = settings.node
    if password is None:
        password = resolve_password(node.password_file or None, interactive=False)
    account = load_or_create_node_key(node.key_file, password)
    return identity_from_key(bytes(account.key))


def model_of(settings: Settings) -> ModelConfig:
    """The run's model; its vocabulary is the data set's tokenizer's (``training.data``), else
    ``training.vocab_size``'s."""
    try:
        training = settings.training
        return model_for_run(
            training.model,
            training.seq_len,
            training.stages,
            run_vocab(training.data, training.vocab_size),
        )
    except ModelConfigError as exc:
        raise ConfigError(f"training.model={settings.training.model!r}: {exc}") from exc


def flow_config(settings: Settings, model: ModelConfig) -> FlowConfig:
    """The flow protocol's parameters from the ``flow`` section (names of the settings file)."""
    flow, training = settings.flow, settings.training
    # Bytes of one activation crossing an edge: (batch, seq, d_model) in the wire dtype.
    wire = training.param_dtype if training.wire_dtype == "param" else training.wire_dtype
    wire_bytes = {"float64": 8, "float32": 4}.get(wire, 2)
    activation_bytes = float(wire_bytes * training.batch_size * training.seq_len * model.d_model)
    return FlowConfig(
        stages=training.stages,
        activation_bytes=activation_bytes,
        decision_period_s=flow.decision_period_s,
        relay_temperature=flow.temperature_relay,
        data_temperature=flow.temperature_data,
        cooling=flow.cooling_factor,
        anneal_probability_needing=flow.anneal_probability_needy,
        anneal_probability_idle=flow.anneal_probability_idle,
        unmatched_timeout_periods=flow.drop_unmatched_after_periods,
        ack_deadline_s=flow.hop_ack_deadline_s,
        keepalive_interval_s=flow.keepalive_interval_s,
        keepalive_timeout_s=flow.keepalive_timeout_s,
        keepalive_misses=flow.keepalive_misses,
        # The slot list a node sends its upstream peers doubles as its keep-alive: send it at
        # the keep-alive interval, so no separate ping is needed.
        reconcile_periods=max(1, round(flow.keepalive_interval_s / flow.decision_period_s)),
    )


def live_config_from_settings(settings: Settings, password: str | None = None) -> LiveNodeConfig:
    """The live node's configuration; a setting it cannot run with is a ``ConfigError``."""
    node, p2p, training = settings.node, settings.p2p, settings.training
    stages = training.stages
    if node.role == DATA and node.stage not in (-1, 0):
        raise ConfigError(f"node.stage={node.stage}: a data node sits at stage 0; drop node.stage")
    if node.role != DATA and not (1 <= node.stage <= stages or node.stage == AUTO_STAGE):
        raise ConfigError(
            f"node.stage={node.stage} is not a relay stage of this run; set it to 1..{stages}, "
            "or -1 to take the run's bottleneck stage"
        )
    if p2p.topology_file and not Path(p2p.topology_file).is_file():
        raise ConfigError(f"p2p.topology_file={p2p.topology_file!r} does not exist; fix the path")
    topology = Topology.from_json_file(Path(p2p.topology_file)) if p2p.topology_file else None
    if topology is not None and p2p.region not in topology.regions:
        raise ConfigError(
            f"p2p.region={p2p.region!r} is not a region of {p2p.topology_file}; choose one of "
            f"{list(topology.regions)}"
        )
    model = model_of(settings)
    admit = admission_from_settings(settings)
    return LiveNodeConfig(
        name=node.name,
        role=node.role,
        stage=0 if node.role == DATA else node.stage,
        region=p2p.region,
        capacity=node.capacity,
        identity=node_identity(settings, password),
        model=model,
        stages=stages,
        batch_size=training.batch_size,
        seq_len=training.seq_len,
        training=training,
        flow=flow_config(settings, model),
        run_id=settings.chain.run_id,
        seed=training.seed,
        bootstrap=p2p.bootstrap_peers,
        listen=p2p.listen,
        announce=p2p.announce,
        reachable=None if p2p.reachable == "auto" else bool(p2p.reachable),
        relay_service=p2p.relay_service == "on"
        or (p2p.relay_service == "auto" and node.role == DATA),
        relay_limits=RelayLimits(
            circuits_per_peer=p2p.relay_circuits_per_peer,
            peer_bytes_per_s=p2p.relay_peer_bytes_per_s,
            peer_burst_bytes=p2p.relay_peer_burst_bytes,
        ),
        relays=p2p.relays,
        upnp=p2p.upnp,
        hole_punch=p2p.hole_punch,
        topology=topology,
        iterations=training.iterations,
        batch=training.microbatches_per_iteration,
        stall_timeout_s=training.stall_timeout_s,
        join=node.join,
        flow_timeout_s=settings.flow.setup_timeout_s,
        wait_for_peers_s=settings.flow.wait_for_peers_s or math.inf,
        discovery_period_s=p2p.discovery_period_s,
        compute_ms=node.compute_ms,
        emulated_speed=node.emulated_speed,
        emulated_hop_s=node.emulated_hop_ms / 1000.0,
        admit=admit,
        origins=None if admit is None else admit.is_data_node,
        try_domain=try_domain_from_settings(settings),
        routing=settings.flow.routing,
        data_nodes=training.data_nodes,
        data_shard=training.data_shard,
        receipts=receipts_from_settings(settings, password),
        dataset_hash=run_dataset_hash(settings),
        resume_dir=resume_dir(settings),
    )


def resume_dir(settings: Settings) -> Path | None:
    """Where a data node keeps its resume points: ``checkpoints/run-<id>`` in its home (None
    without one: ``gwtf-node start`` always gives it one)."""
    if settings.node.role != DATA or not settings.node.data_dir:
        return None
    return Path(settings.node.data_dir) / "checkpoints" / f"run-{settings.chain.run_id}"


def try_domain_from_settings(settings: Settings) -> Eip712Domain:
    """The run's try token domain: its chain id and WorkLedger when the node is on a chain
    (admission or receipts on), as its receipts' domain; ``NO_CHAIN_TRY_DOMAIN`` otherwise."""
    chain = settings.chain
    if not (chain.admission or chain.receipts):
        return NO_CHAIN_TRY_DOMAIN
    contracts, _ = open_contracts(settings)
    return try_token_domain(contracts.w3.eth.chain_id, contracts.ledger.address)


def run_dataset_hash(settings: Settings) -> str | None:
    """A data node's run's data set hash on chain (hex), once ``training.data`` is checked to
    be that data set; None for a relay, or a node off chain."""
    chain = settings.chain
    if settings.node.role != DATA or chain.run_id < 1 or not (chain.admission or chain.receipts):
        return None
    contracts, _ = open_contracts(settings)
    run = contracts.port().run_info(chain.run_id)
    if run is None:
        raise ConfigError(f"chain.run_id={chain.run_id}: no such run on this chain")
    check_run_dataset(chain.run_id, run.dataset_hash, settings.training.data)
    return run.dataset_hash.hex()


def admission_from_settings(settings: Settings) -> RunAdmission | None:
    """``RunAdmission`` over the chain named by the settings, or None when admission is off."""
    chain = settings.chain
    if not chain.admission:
        return None
    if chain.run_id < 1:
        raise ConfigError("chain.admission is on but chain.run_id is not set; set the run's id")
    contracts, _ = open_contracts(settings)
    return RunAdmission(contracts.port(), chain.run_id, cache_s=chain.admission_cache_s)


def receipts_from_settings(
    settings: Settings, password: str | None = None
) -> ReceiptsConfig | None:
    """Receipts and the epoch cycle over the chain named by the settings, or None when off."""
    chain = settings.chain
    if not chain.receipts:
        if settings.node.cheat:
            raise ConfigError("node.cheat needs chain.receipts on: a cheat is in the receipts")
        return None
    if chain.run_id < 1:
        raise ConfigError("chain.receipts is on but chain.run_id is not set; set the run's id")
    contracts, _ = open_contracts(settings)
    check_cheat(settings.node.cheat, settings.node.role, contracts.w3.eth.chain_id)
    run = contracts.port().run_info(chain.run_id)
    if run is None:
        raise ConfigError(f"chain.run_id={chain.run_id}: no such run on this chain")
    if run.stage_count != settings.training.stages:
        raise ConfigError(
            f"training.stages={settings.training.stages} but run {chain.run_id} has "
            f"{run.stage_count} stages; set training.stages to the run's"
        )
    wallet = None
    if chain.wallet_file:
        if password is None:
            password = resolve_password(settings.node.password_file or None, interactive=False)
        wallet = Sender.from_account(open_wallet(chain.wallet_file, password))
    terms = ReceiptTerms(
        chain.run_id,
        ledger_domain(contracts.w3.eth.chain_id, contracts.ledger.address),
        run.stage_count,
        run.units_per_hop,
    )
    ledger = EpochLedger(contracts, chain.run_id, wallet)
    try:
        batches = BatchSettings(
            chain.batch_max_hops, chain.batch_max_age_s, chain.batch_close_timeout_s
        )
    except ValueError as exc:
        raise ConfigError(f"chain.batch_*: {exc}") from exc
    return ReceiptsConfig(
        terms,
        settings.db.url,
        ledger,
        report_period_s=chain.report_period_s,  # and the grace that follows (``grace_for``)
        batches=batches,
        clock_period_s=chain.clock_period_s,
        cheat=settings.node.cheat,
        evidence_dir=chain.evidence_dir if settings.node.role == "relay" else "",
        evidence_epochs=chain.evidence_epochs or evidence_epochs_of(run),
        auto_claim=chain.auto_claim,
    )


def local_api_from_settings(settings: Settings) -> LocalApi | None:
    """The local API's socket, bound now (a port in use stops the node before it starts), and
    its token; None when ``api.enabled`` is off."""
    api = settings.api
    if not api.enabled:
        return None
    if api.host not in LOOPBACK:
        log.warning("api.host=%s: the local API is reachable from other machines", api.host)
    token = api_token(api.token_file)
    return LocalApi(
        bind_api_socket(api.host, api.port), token, api.snapshot_period_s, api.chain_period_s
    )


def evidence_epochs_of(run: RunInfo) -> int:
    """Epochs whose new hops a relay keeps evidence of for ``run``: the epoch it works in, the
    one being certified, and every epoch whose challenge window is still open. Kept evidence
    goes only once its epoch is settled with no dispute open
    (``gwtf.node.receipts.evidence.prune_settled_evidence``), never by this count."""
    return 2 + -(-run.challenge_window_s // max(1, run.epoch_length_s))
