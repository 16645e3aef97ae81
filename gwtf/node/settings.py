"""The node's settings: one object with a frozen section per concern, loaded and validated once.

Sections: ``node`` (who this node is in the run: role, stage, capacity), ``p2p``, ``chain``,
``training`` (with ``[training.optimizer]``; the one ``TrainingSettings`` of the stage engine),
``flow``, ``db``, ``api``, ``log``. Precedence, highest first: CLI flags >
``GWTF_<SECTION>_<FIELD>`` environment variables > ``gwtf.toml`` > the defaults written below.
Every value is checked at start-up and a bad one stops the node with a ``ConfigError`` that
names it and says how to fix it. A nested section's keys are dotted: ``training.optimizer.lr``
is ``[training.optimizer] lr`` in the toml file and ``GWTF_TRAINING_OPTIMIZER_LR`` in the
environment.

Secrets (the RPC token; keystore passwords live in ``gwtf.node.chain.wallet``) come only from the
environment or a flag, never from the toml file, and are wrapped in ``Secret`` so that no
``repr``, log line or ``describe()`` output can show them.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gwtf.errors import ConfigError
from gwtf.node.p2p.addresses import ALL_INTERFACES, check_announce, check_listen, check_relays
from gwtf.node.training.settings import OptimizerSettings, TrainingSettings

__all__ = ["OptimizerSettings", "Settings", "TrainingSettings", "load_settings"]

DEFAULT_CONFIG_FILE = "gwtf.toml"
ENV_PREFIX = "GWTF_"
#: A setting that is either decided by the node itself ("auto") or forced.
AutoBool = typing.Literal["auto"] | bool
ENV_CONFIG_FILE = "GWTF_CONFIG"
ENV_RPC_TOKEN = "GWTF_RPC_TOKEN"
# A settings file is a few KiB; anything far larger is a mistake, not a configuration.
MAX_CONFIG_BYTES = 256 * 1024
# Keys that hold secrets; they may never be read from a committed file.
SECRET_KEYS = frozenset({"rpc_token", "password", "wallet_password", "private_key"})


class Secret:
    """A string that never shows itself in ``repr``/``str``; call ``reveal()`` where it is used."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret('***')"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(("Secret", self._value))


#: ``node.stage`` of a relay that takes the run's bottleneck stage when it starts.
AUTO_STAGE = -1


@dataclass(frozen=True)
class NodeSettings:
    """Who this node is in its run."""

    name: str = "node"
    role: str = "relay"  # "data" | "relay"
    #: The node key's encrypted keystore: its address is the node on chain, it is the node's
    #: libp2p identity and it signs receipts (created on first start when missing).
    key_file: str = ".gwtf/node-key.json"
    #: A file holding the keystore's password; "" reads GWTF_WALLET_PASSWORD instead.
    password_file: str = ""
    #: A relay's stage, 1..training.stages; a data node sits at 0. A relay at -1 takes the run's
    #: bottleneck stage when it starts, as its bootstrap peers' answers show it.
    stage: int = -1
    #: Microbatches this node holds in flight at once (what it advertises to the flow protocol).
    capacity: int = 2
    #: A relay that enters a running swarm: it first downloads its stage's current weights. A
    #: data node (of a run with several): it asks to be taken (back) in, then loads theirs.
    join: bool = False
    #: This node's compute time for one microbatch of its stage, before it measures its own.
    compute_ms: float = 100.0
    #: Emulates a slower GPU (0 < speed <= 1): each hop's compute is stretched to 1 / speed of
    #: what it took, by waiting, so a swarm on one machine mixes GPU speeds like the simulator's
    #: heterogeneous scenarios (1.0 / 0.6 / 0.35). Leave 1.0 on a real node.
    emulated_speed: float = 1.0
    #: Emulation too: each hop's compute lasts at least this long (before the speed stretches
    #: it), so a swarm of a small model on one machine spends its time like GPUs on a big
    #: one, not on its shared CPUs. Leave 0 on a real node.
    emulated_hop_ms: float = 0.0
    #: Makes this node dishonest on purpose, in one named way, for tests and the demo
    #: (``gwtf.node.receipts.cheats``: forge-countersignature, phantom-hops, inflate-units,
    #: shift-span or withhold-leaf for a data node; claim-twice, equivocate or wrong-tensor for
    #: a relay). Needs ``chain.receipts``. Leave "" (honest) on a real node: an auditor finds
    #: every cheat.
    cheat: str = ""
    #: The node's home: its database, API token, evidence and lock (``gwtf.node.home``); "" is
    #: ``.gwtf/nodes/<node name>``. ``gwtf-node start`` locks it, so two nodes never share one.
    data_dir: str = ""


@dataclass(frozen=True)
class P2PSettings:
    #: TCP multiaddrs to listen on; ``/ip4/0.0.0.0/tcp/P`` is every IPv4 interface, port 0 any
    #: free port. ``/ip4/127.0.0.1/tcp/0`` keeps the node to this machine.
    listen: tuple[str, ...] = (ALL_INTERFACES,)
    #: Public addresses peers reach this node at (``/ip4/IP/tcp/PORT``, ``/dns4/NAME/tcp/PORT``:
    #: a port forwarded on its router), advertised before the listen addresses.
    announce: tuple[str, ...] = ()
    #: Ask the home router (UPnP IGD) to forward a port to the node; advertised once peers
    #: reach the node through it.
    upnp: bool = True
    bootstrap_peers: tuple[str, ...] = ()
    connect_timeout_s: float = 10.0
    max_message_bytes: int = 64 * 1024 * 1024
    #: This node's region in the topology file (link emulation), e.g. "oregon".
    region: str = "local"
    #: A JSON topology (regions, latency, bandwidth) to emulate links with; "" for none.
    topology_file: str = ""
    discovery_period_s: float = 1.0
    #: Whether peers can dial this node directly: "auto" lets its dial-back check decide (a
    #: node on loopback only counts as reachable); ``true``/``false`` force it. A node that is
    #: not reachable (or not yet known to be) holds slots at relays and advertises the
    #: circuits through them first.
    reachable: AutoBool = "auto"
    #: Relay circuits for nodes behind NAT: "auto" relays on a data node only, "on" on any
    #: (reachable) node, "off" never.
    relay_service: str = "auto"
    #: What each peer may send through this node's relay service, over all its circuits: bytes
    #: a second, and bytes at once above that (a peer over it is slowed, not cut: each circuit
    #: end still forwards 128 KiB/s); and how many circuits one peer may open through it at
    #: once (more are refused). Sized for the presets' activations
    #: (``gwtf.node.p2p.relay_service.RelayLimits``).
    relay_peer_bytes_per_s: int = 2 << 20
    relay_peer_burst_bytes: int = 16 << 20
    relay_circuits_per_peer: int = 8
    #: Full addresses of relays to hold slots at when unreachable; empty: the bootstrap peers.
    relays: tuple[str, ...] = ()
    #: Two nodes behind NAT that meet through a relay try to open a direct connection (DCUtR
    #: hole punching, ``gwtf.node.p2p.holepunch``) and stay on the relay where it fails.
    hole_punch: bool = True


@dataclass(frozen=True)
class ChainSettings:
    #: JSON-RPC URL; empty means "the URL written by `gwtf-node devnet` in devnet_file".
    rpc_url: str = ""
    devnet_file: str = ".gwtf/devnet.json"
    run_id: int = 0
    rpc_timeout_s: float = 10.0
    #: Serve only peers whose libp2p id the chain binds to a staked node of ``run_id``.
    admission: bool = False
    #: How long an admission answer is reused before the chain is asked again.
    admission_cache_s: float = 30.0
    #: Receipts on every hop (recorded, signed and countersigned in batches, kept in the node
    #: database, reported to the data node) and the epoch cycle: a data node certifies and
    #: submits each epoch, a relay claims its reward. Needs ``run_id`` and the chain.
    receipts: bool = False
    #: The staking wallet's keystore (a data node's: its sponsor's), which submits
    #: certificates or claims rewards; its password is ``node.password_file``'s. "" sends
    #: nothing (receipts are still kept).
    wallet_file: str = ""
    #: How often chain time is read (it runs on by the local clock in between), and how often
    #: a relay reports the complete receipts it holds (as worker and as receiver) to their
    #: data nodes; a data node waits two
    #: report periods and a second after an epoch's last iteration for the last reports.
    clock_period_s: float = 2.0
    report_period_s: float = 5.0
    #: A worker signs its receipts for one receiver in batches (its receiver countersigns
    #: each): one closes every ``batch_max_hops`` hops (1 to 4096), once its oldest hop is
    #: ``batch_max_age_s`` old (at most 300), or at the iteration's end; a receiver that does
    #: not answer within ``batch_close_timeout_s`` withheld it (no hops to it that iteration).
    batch_max_hops: int = 256
    batch_max_age_s: float = 10.0
    batch_close_timeout_s: float = 10.0
    #: Where a relay keeps each hop's input and output frames and its stage's state at each
    #: iteration, for auditors to re-execute (``gwtf.node.store.evidence``); "" keeps nothing.
    evidence_dir: str = ".gwtf/evidence"
    #: Epochs whose hops' evidence is kept; 0 takes what the run's challenge window needs (the
    #: epoch being worked, the one being certified and those still open to disputes). Kept
    #: evidence goes once its epoch is settled on chain with no dispute of it open.
    evidence_epochs: int = 0
    #: A relay claims each settled epoch by itself; off, it claims only when asked
    #: (``gwtf-node claim``, or ``POST /v1/claim`` on its API).
    auto_claim: bool = True
    #: Bearer token for RPC providers that need one; from GWTF_RPC_TOKEN or a flag only.
    rpc_token: Secret | None = field(default=None, repr=False)


@dataclass(frozen=True)
class FlowSettings:
    # Starting points from the GWTF authors' 2024 prototype.
    decision_period_s: float = 2.0
    #: Ours, not the prototype's: relative to the path cost, 0 is greedy (protocol/annealing.py).
    temperature_relay: float = 0.001
    temperature_data: float = 0.001
    cooling_factor: float = 0.95
    anneal_probability_needy: float = 0.3
    anneal_probability_idle: float = 0.1
    drop_unmatched_after_periods: int = 12
    hop_ack_deadline_s: float = 20.0
    keepalive_interval_s: float = 20.0
    keepalive_timeout_s: float = 5.0
    keepalive_misses: int = 3
    delay_estimate_old_weight: float = 0.6
    #: "gwtf" follows the flow table; "swarm" is SWARM's throughput-weighted wiring (baseline).
    routing: str = "gwtf"
    #: How long a node waits for its first flows, or a joiner for its stage's weights.
    setup_timeout_s: float = 60.0
    #: How long a data node waits for a relay of stage 1, and a relay for a node of the run to
    #: answer it, before giving up; 0 waits until stopped (saying what it waits for), so nodes
    #: may start in any order.
    wait_for_peers_s: float = 0.0


@dataclass(frozen=True)
class DbSettings:
    url: str = "sqlite:///.gwtf/node.sqlite"


@dataclass(frozen=True)
class ApiSettings:
    """The node's local REST API and dashboard (``gwtf/api/``); 127.0.0.1 keeps it to this
    machine."""

    enabled: bool = True
    host: str = "127.0.0.1"
    port: int = 8787  # 0 picks a free one (the node's status and log say which)
    #: The bearer token of the API's mutating routes (claim), made (0600) when missing.
    token_file: str = ".gwtf/api-token"
    #: How often the node's status snapshot is taken, and the chain's view of the run read.
    snapshot_period_s: float = 1.0
    chain_period_s: float = 5.0


@dataclass(frozen=True)
class LogSettings:
    level: str = "INFO"
    json: bool = False


@dataclass(frozen=True)
class Settings:
    node: NodeSettings = NodeSettings()
    p2p: P2PSettings = P2PSettings()
    chain: ChainSettings = ChainSettings()
    training: TrainingSettings = field(default_factory=TrainingSettings)
    flow: FlowSettings = FlowSettings()
    db: DbSettings = DbSettings()
    api: ApiSettings = ApiSettings()
    log: LogSettings = LogSettings()

    def describe(self) -> dict[str, dict[str, object]]:
        """Every setting as plain values, secrets masked: safe to print or log."""
        out: dict[str, dict[str, object]] = {}
        for section_field in dataclasses.fields(self):
            section = getattr(self, section_field.name)
            out[section_field.name] = {
                f.name: _plain(getattr(section, f.name)) for f in dataclasses.fields(section)
            }
        return out


def _plain(value: object) -> object:
    if isinstance(value, Secret):
        return "***"
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return value


#: Section name -> its dataclass, in the order of ``Settings``.
SECTIONS: dict[str, type[Any]] = dict(typing.get_type_hints(Settings))

_LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
_DB_SCHEMES = ("sqlite:///", "postgresql://", "postgresql+psycopg://", "postgresql+psycopg2://")


def _port(v: int) -> str | None:
    return None if 0 <= v <= 65535 else "must be a TCP port between 0 and 65535"


def _positive(v: float) -> str | None:
    return None if v > 0 else "must be greater than 0"


def _probability(v: float) -> str | None:
    return None if 0.0 <= v <= 1.0 else "must be between 0 and 1"


def _speed(v: float) -> str | None:
    return None if 0.0 < v <= 1.0 else "must be above 0 and at most 1 (it only slows compute)"


def _fraction_open(v: float) -> str | None:
    return None if 0.0 < v < 1.0 else "must be strictly between 0 and 1"


#: The least rate a relay may give each peer: the floors of the most circuits a peer may open
#: itself (8 x 128 KiB/s, ``RelayLimits.circuit_floor_bytes_per_s``), so that a peer alone on
#: its own circuits gets at most twice its rate. The 16 circuits others may open to it add
#: 2 MiB/s of floors more (``RelayLimits``: rate + 3 MiB/s at most).
MIN_RELAY_PEER_BYTES_PER_S = 1 << 20


def _relay_rate(v: int) -> str | None:
    if v >= MIN_RELAY_PEER_BYTES_PER_S:
        return None
    return (
        f"must be at least {MIN_RELAY_PEER_BYTES_PER_S}: the floors of the 8 circuits a peer "
        "opens alone move that much"
    )


#: The least burst: a relay reads a peer's leg 64 KiB at a time (what an end's floor holds),
#: or its burst when smaller, and smaller reads cost a yamux frame and a wake-up each.
MIN_RELAY_PEER_BURST_BYTES = 64 * 1024
#: The most circuits a peer may hold open through a relay: more are never reached, since a
#: relay takes at most ``RelayLimits.hop_streams_per_peer`` (10) hop streams of one peer at once,
#: and a reservation's refresh and a stream still asking need room beside its circuits.
MAX_RELAY_CIRCUITS_PER_PEER = 8


def _relay_burst(v: int) -> str | None:
    if v >= MIN_RELAY_PEER_BURST_BYTES:
        return None
    return f"must be at least {MIN_RELAY_PEER_BURST_BYTES}: a smaller burst shrinks every read"


def _relay_circuits(v: int) -> str | None:
    if 1 <= v <= MAX_RELAY_CIRCUITS_PER_PEER:
        return None
    return f"must be within 1..{MAX_RELAY_CIRCUITS_PER_PEER}: a relay takes no more hop streams"


def _non_negative(v: int) -> str | None:
    return None if v >= 0 else "must be 0 or more"


def _non_empty(v: str) -> str | None:
    return None if v.strip() else "must not be empty"


def _one_of(*choices: str) -> Callable[[str], str | None]:
    def check(v: str) -> str | None:
        return None if v in choices else f"must be one of {', '.join(choices)}"

    return check


def _rpc_url(v: str) -> str | None:
    if v == "" or v.startswith(("http://", "https://")):
        return None
    return "must be an http:// or https:// JSON-RPC URL (or empty to use the devnet file)"


def _db_url(v: str) -> str | None:
    if v.startswith(_DB_SCHEMES):
        return None
    return "must be a sqlite:///PATH or postgresql://... URL"


def _stage(v: int) -> str | None:
    return None if v >= -1 else "must be a stage index, or -1 to let the node choose"


def _model_name(v: str) -> str | None:
    family, _, size = v.partition("-")
    return None if family and size else "must name a model as family-size, e.g. gpt-tiny"


def _positive_int(v: int) -> str | None:
    return None if v >= 1 else "must be 1 or more"


def _batch_hops(v: int) -> str | None:
    # A receipt's proof in its batch is at most 12 hashes on the wire (2**12 leaves).
    return None if 1 <= v <= 4096 else "must be 1 to 4096 hops a batch"


def _batch_seconds(v: float) -> str | None:
    return None if 0 < v <= 300 else "must be more than 0 and at most 300 seconds"


# Field checks by "section.field"; fields without an entry only need the right type.
VALIDATORS: dict[str, Callable[[Any], str | None]] = {
    "p2p.listen": check_listen,
    "p2p.announce": check_announce,
    "p2p.relays": check_relays,
    "p2p.connect_timeout_s": _positive,
    "p2p.max_message_bytes": _positive,
    "chain.rpc_url": _rpc_url,
    "chain.devnet_file": _non_empty,
    "chain.run_id": _non_negative,
    "chain.rpc_timeout_s": _positive,
    "node.name": _non_empty,
    "node.role": _one_of("data", "relay"),
    "node.stage": _stage,
    "node.capacity": _positive_int,
    "node.compute_ms": _positive,
    "node.emulated_speed": _speed,
    "node.emulated_hop_ms": _non_negative,
    "node.key_file": _non_empty,
    "p2p.region": _non_empty,
    "p2p.discovery_period_s": _positive,
    "p2p.relay_service": _one_of("auto", "on", "off"),
    "p2p.relay_peer_bytes_per_s": _relay_rate,
    "p2p.relay_peer_burst_bytes": _relay_burst,
    "p2p.relay_circuits_per_peer": _relay_circuits,
    "chain.admission_cache_s": _non_negative,
    "chain.clock_period_s": _positive,
    "chain.report_period_s": _positive,
    "chain.batch_max_hops": _batch_hops,
    "chain.batch_max_age_s": _batch_seconds,
    "chain.batch_close_timeout_s": _batch_seconds,
    "training.model": _model_name,
    "training.device": _one_of("auto", "cpu", "cuda"),
    "training.param_dtype": _one_of("float32", "float64"),
    "training.wire_dtype": _one_of("param", "bfloat16", "float16"),
    "training.stages": _positive_int,
    "training.batch_size": _positive_int,
    "training.seq_len": _positive_int,
    "training.iterations": _non_negative,
    "training.microbatches_per_iteration": _positive_int,
    "training.stall_timeout_s": _positive,
    "training.data_nodes": _positive_int,
    "training.data_shard": _non_negative,
    "training.max_in_flight": _positive_int,
    "training.memory_limit_mib": _non_negative,
    "training.codec_max_bytes": _positive_int,
    "training.optimizer.lr": _positive,
    "training.optimizer.total_steps": _positive_int,
    "flow.decision_period_s": _positive,
    "flow.temperature_relay": _non_negative,
    "flow.temperature_data": _non_negative,
    "flow.cooling_factor": _fraction_open,
    "flow.anneal_probability_needy": _probability,
    "flow.anneal_probability_idle": _probability,
    "flow.drop_unmatched_after_periods": _positive,
    "flow.hop_ack_deadline_s": _positive,
    "flow.keepalive_interval_s": _positive,
    "flow.keepalive_timeout_s": _positive,
    "flow.keepalive_misses": _positive,
    "flow.delay_estimate_old_weight": _probability,
    "flow.routing": _one_of("gwtf", "swarm"),
    "flow.setup_timeout_s": _positive,
    "flow.wait_for_peers_s": _non_negative,
    "db.url": _db_url,
    "api.host": _non_empty,
    "api.port": _port,
    "api.token_file": _non_empty,
    "api.snapshot_period_s": _positive,
    "api.chain_period_s": _positive,
    "log.level": _one_of(*_LOG_LEVELS),
}


def env_var_name(section: str, name: str) -> str:
    """``("training", "optimizer.lr")`` -> ``GWTF_TRAINING_OPTIMIZER_LR``."""
    return f"{ENV_PREFIX}{section.upper()}_{name.replace('.', '_').upper()}"


def _coerce(key: str, kind: Any, raw: object, source: str) -> object:
    """Turn a toml value or an env/flag string into the field's type, or explain the mismatch."""

    def bad(expected: str) -> ConfigError:
        return ConfigError(f"{key}={raw!r} from {source} is not {expected}; fix it in {source}")

    if typing.get_origin(kind) is typing.Literal:
        # The value's validator (below) names the choices; this only checks the type.
        if isinstance(raw, str):
            return raw
        raise bad("a string")
    if kind == AutoBool:
        if raw == "auto":
            return "auto"
        if isinstance(raw, bool | str):
            try:
                return _coerce(key, bool, raw, source)
            except ConfigError:
                pass
        raise bad('"auto", true or false')
    if kind is bool:
        if isinstance(raw, bool):
            return raw
        if isinstance(raw, str) and raw.lower() in (
            "1",
            "true",
            "yes",
            "on",
            "0",
            "false",
            "no",
            "off",
        ):
            return raw.lower() in ("1", "true", "yes", "on")
        raise bad("a boolean (true/false)")
    if kind is int:
        if isinstance(raw, int) and not isinstance(raw, bool):
            return raw
        if isinstance(raw, str):
            try:
                return int(raw.strip(), 0)
            except ValueError:
                pass
        raise bad("an integer")
    if kind is float:
        if isinstance(raw, int | float) and not isinstance(raw, bool):
            return float(raw)
        if isinstance(raw, str):
            try:
                return float(raw.strip())
            except ValueError:
                pass
        raise bad("a number")
    if kind is str:
        if isinstance(raw, str):
            return raw
        raise bad("a string")
    if kind == tuple[str, ...]:
        if isinstance(raw, str):
            return tuple(p.strip() for p in raw.split(",") if p.strip())
        if isinstance(raw, list) and all(isinstance(p, str) for p in raw):
            return tuple(raw)
        raise bad("a list of strings (comma-separated in env vars and flags)")
    if kind == Secret | None:
        if isinstance(raw, Secret):
            return raw
        if isinstance(raw, str):
            return Secret(raw) if raw else None
        raise bad("a string")
    raise ConfigError(f"{key} has an unsupported type {kind!r}; this is a bug, please report it")


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        if path.stat().st_size > MAX_CONFIG_BYTES:
            raise ConfigError(
                f"{path} is larger than {MAX_CONFIG_BYTES} bytes; is it the right file?"
            )
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path} is not valid TOML ({exc}); fix the file or remove it") from exc
    except OSError as exc:
        raise ConfigError(f"cannot read settings file {path} ({exc.strerror})") from exc


def _is_section(kind: Any) -> bool:
    return isinstance(kind, type) and dataclasses.is_dataclass(kind)


def _leaf_types(prefix: str, cls: type[Any]) -> dict[str, Any]:
    """Every setting below ``prefix`` ("training") as "training.optimizer.lr" -> its type."""
    leaves: dict[str, Any] = {}
    for name, kind in typing.get_type_hints(cls).items():
        key = f"{prefix}.{name}"
        leaves.update(_leaf_types(key, kind) if _is_section(kind) else {key: kind})
    return leaves


#: Every setting ("section.field", or "section.sub.field" in a nested section) -> its type.
LEAVES: dict[str, Any] = {
    key: kind
    for section, cls in SECTIONS.items()
    for key, kind in _leaf_types(section, cls).items()
}


def _flatten(prefix: str, values: Mapping[str, Any], path: Path) -> dict[str, object]:
    layer: dict[str, object] = {}
    for name, value in values.items():
        key = f"{prefix}.{name}"
        if name in SECRET_KEYS:
            raise ConfigError(
                f"{key} is a secret and must not be in {path}; remove it and set "
                f"{ENV_RPC_TOKEN if name == 'rpc_token' else 'it by env var or flag'} instead"
            )
        if isinstance(value, dict) and key not in LEAVES:
            layer.update(_flatten(key, value, path))
        else:
            layer[key] = value
    return layer


def _toml_layer(data: Mapping[str, Any], path: Path) -> dict[str, object]:
    layer: dict[str, object] = {}
    for section, values in data.items():
        if section not in SECTIONS:
            raise ConfigError(
                f"unknown section [{section}] in {path}; valid sections: {', '.join(SECTIONS)}"
            )
        if not isinstance(values, dict):
            raise ConfigError(f"{section} in {path} must be a table: write [{section}]")
        layer.update(_flatten(section, values, path))
    return layer


def _env_layer(env: Mapping[str, str]) -> dict[str, object]:
    layer: dict[str, object] = {}
    for key in LEAVES:
        name = env_var_name(*key.split(".", 1))
        if name in env:
            layer[key] = env[name]
    if env.get(ENV_RPC_TOKEN):
        layer["chain.rpc_token"] = env[ENV_RPC_TOKEN]
    return layer


def load_settings(
    cli_overrides: Mapping[str, object] | None = None,
    env: Mapping[str, str] | None = None,
    config_file: str | Path | None = None,
) -> Settings:
    """Build validated ``Settings`` from flags, env vars, a toml file and the defaults.

    ``cli_overrides`` maps ``"section.field"`` to a value; ``None`` values mean "flag not given".
    ``config_file`` defaults to $GWTF_CONFIG, else ``./gwtf.toml`` when it exists.
    """
    env = os.environ if env is None else env
    explicit = config_file if config_file is not None else env.get(ENV_CONFIG_FILE)
    path = Path(explicit) if explicit else Path(DEFAULT_CONFIG_FILE)
    if explicit and not path.is_file():
        raise ConfigError(f"settings file {path} does not exist; create it or drop --config")
    toml_values = _toml_layer(_read_toml(path), path) if path.is_file() else {}

    layers: list[tuple[str, dict[str, object]]] = [
        (str(path), toml_values),
        ("the environment", _env_layer(env)),
        ("the command line", {k: v for k, v in (cli_overrides or {}).items() if v is not None}),
    ]
    chosen: dict[str, tuple[object, str]] = {}
    for source, layer in layers:
        for key, value in layer.items():
            chosen[key] = (value, source)
    return _build(chosen)


def _build(chosen: Mapping[str, tuple[object, str]]) -> Settings:
    for key, (_, source) in chosen.items():
        if key not in LEAVES:
            raise ConfigError(f"unknown setting {key} from {source}; check its spelling")
    sections = {name: _build_section(name, cls, chosen) for name, cls in SECTIONS.items()}
    settings = Settings(**sections)
    # Checks across fields (the optimizer's min_lr <= lr, ...) name the keys they refuse.
    settings.training.validate()
    return settings


def _build_section(prefix: str, cls: type[Any], chosen: Mapping[str, tuple[object, str]]) -> Any:
    kwargs: dict[str, object] = {}
    for name, kind in typing.get_type_hints(cls).items():
        key = f"{prefix}.{name}"
        if _is_section(kind):
            kwargs[name] = _build_section(key, kind, chosen)
            continue
        if key not in chosen:
            continue
        raw, source = chosen[key]
        value = _coerce(key, kind, raw, source)
        problem = VALIDATORS[key](value) if key in VALIDATORS else None
        if problem:
            shown = "***" if isinstance(value, Secret) else repr(value)
            raise ConfigError(f"{key}={shown} from {source} {problem}; fix it in {source}")
        kwargs[name] = value
    return cls(**kwargs)
