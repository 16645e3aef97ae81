"""The node's settings: one object with a frozen section per concern, loaded and validated once.

Precedence, highest first: CLI flags > ``GWTF_<SECTION>_<FIELD>`` environment variables >
``gwtf.toml`` > the defaults written below. Every value is checked at start-up and a bad one
stops the node with a ``ConfigError`` that names it and says how to fix it.

Secrets (the RPC token; keystore passwords live in ``node.wallet``) come only from the
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

DEFAULT_CONFIG_FILE = "gwtf.toml"
ENV_PREFIX = "GWTF_"
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


@dataclass(frozen=True)
class P2PSettings:
    listen_host: str = "127.0.0.1"
    listen_port: int = 0
    bootstrap_peers: tuple[str, ...] = ()
    connect_timeout_s: float = 10.0
    max_message_bytes: int = 64 * 1024 * 1024


@dataclass(frozen=True)
class ChainSettings:
    #: JSON-RPC URL; empty means "the URL written by `gwtf-node devnet` in devnet_file".
    rpc_url: str = ""
    devnet_file: str = ".gwtf/devnet.json"
    run_id: int = 0
    rpc_timeout_s: float = 10.0
    #: Bearer token for RPC providers that need one; from GWTF_RPC_TOKEN or a flag only.
    rpc_token: Secret | None = field(default=None, repr=False)


@dataclass(frozen=True)
class TrainingSettings:
    device: str = "auto"
    stage: int = -1
    max_microbatches_in_flight: int = 4
    dtype: str = "float32"


@dataclass(frozen=True)
class FlowSettings:
    # Starting points from the GWTF authors' 2024 prototype (see DESIGN.md section 2).
    decision_period_s: float = 2.0
    temperature_relay: float = 1.7
    temperature_data: float = 2.0
    cooling_factor: float = 0.95
    anneal_probability_needy: float = 0.3
    anneal_probability_idle: float = 0.1
    drop_unmatched_after_periods: int = 12
    hop_ack_deadline_s: float = 20.0
    keepalive_interval_s: float = 20.0
    keepalive_timeout_s: float = 5.0
    keepalive_misses: int = 3
    delay_estimate_old_weight: float = 0.6


@dataclass(frozen=True)
class DbSettings:
    url: str = "sqlite:///.gwtf/node.sqlite"


@dataclass(frozen=True)
class ApiSettings:
    enabled: bool = True
    host: str = "127.0.0.1"
    port: int = 8787


@dataclass(frozen=True)
class LogSettings:
    level: str = "INFO"
    json: bool = False


@dataclass(frozen=True)
class Settings:
    p2p: P2PSettings = P2PSettings()
    chain: ChainSettings = ChainSettings()
    training: TrainingSettings = TrainingSettings()
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
                f.name: ("***" if isinstance(v, Secret) else v)
                for f in dataclasses.fields(section)
                for v in [getattr(section, f.name)]
            }
        return out


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


def _fraction_open(v: float) -> str | None:
    return None if 0.0 < v < 1.0 else "must be strictly between 0 and 1"


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


# Field checks by "section.field"; fields without an entry only need the right type.
VALIDATORS: dict[str, Callable[[Any], str | None]] = {
    "p2p.listen_host": _non_empty,
    "p2p.listen_port": _port,
    "p2p.connect_timeout_s": _positive,
    "p2p.max_message_bytes": _positive,
    "chain.rpc_url": _rpc_url,
    "chain.devnet_file": _non_empty,
    "chain.run_id": _non_negative,
    "chain.rpc_timeout_s": _positive,
    "training.device": _one_of("auto", "cpu", "cuda"),
    "training.stage": _stage,
    "training.max_microbatches_in_flight": _positive,
    "training.dtype": _one_of("float32", "bfloat16"),
    "flow.decision_period_s": _positive,
    "flow.temperature_relay": _positive,
    "flow.temperature_data": _positive,
    "flow.cooling_factor": _fraction_open,
    "flow.anneal_probability_needy": _probability,
    "flow.anneal_probability_idle": _probability,
    "flow.drop_unmatched_after_periods": _positive,
    "flow.hop_ack_deadline_s": _positive,
    "flow.keepalive_interval_s": _positive,
    "flow.keepalive_timeout_s": _positive,
    "flow.keepalive_misses": _positive,
    "flow.delay_estimate_old_weight": _probability,
    "db.url": _db_url,
    "api.host": _non_empty,
    "api.port": _port,
    "log.level": _one_of(*_LOG_LEVELS),
}


def env_var_name(section: str, name: str) -> str:
    return f"{ENV_PREFIX}{section.upper()}_{name.upper()}"


def _coerce(key: str, kind: Any, raw: object, source: str) -> object:
    """Turn a toml value or an env/flag string into the field's type, or explain the mismatch."""

    def bad(expected: str) -> ConfigError:
        return ConfigError(f"{key}={raw!r} from {source} is not {expected}; fix it in {source}")

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


def _toml_layer(data: Mapping[str, Any], path: Path) -> dict[str, object]:
    layer: dict[str, object] = {}
    for section, values in data.items():
        if section not in SECTIONS:
            raise ConfigError(
                f"unknown section [{section}] in {path}; valid sections: {', '.join(SECTIONS)}"
            )
        if not isinstance(values, dict):
            raise ConfigError(f"{section} in {path} must be a table: write [{section}]")
        for name, value in values.items():
            if name in SECRET_KEYS:
                raise ConfigError(
                    f"{section}.{name} is a secret and must not be in {path}; remove it and set "
                    f"{ENV_RPC_TOKEN if name == 'rpc_token' else 'it by env var or flag'} instead"
                )
            layer[f"{section}.{name}"] = value
    return layer


def _env_layer(env: Mapping[str, str]) -> dict[str, object]:
    layer: dict[str, object] = {}
    for section, cls in SECTIONS.items():
        for f in dataclasses.fields(cls):
            name = env_var_name(section, f.name)
            if name in env:
                layer[f"{section}.{f.name}"] = env[name]
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
    known = {f"{s}.{f.name}" for s, cls in SECTIONS.items() for f in dataclasses.fields(cls)}
    for key, (_, source) in chosen.items():
        if key not in known:
            raise ConfigError(f"unknown setting {key} from {source}; check its spelling")
    sections: dict[str, object] = {}
    for section, cls in SECTIONS.items():
        hints = typing.get_type_hints(cls)
        kwargs: dict[str, object] = {}
        for f in dataclasses.fields(cls):
            key = f"{section}.{f.name}"
            if key not in chosen:
                continue
            raw, source = chosen[key]
            value = _coerce(key, hints[f.name], raw, source)
            problem = VALIDATORS[key](value) if key in VALIDATORS else None
            if problem:
                shown = "***" if isinstance(value, Secret) else repr(value)
                raise ConfigError(f"{key}={shown} from {source} {problem}; fix it in {source}")
            kwargs[f.name] = value
        sections[section] = cls(**kwargs)
    return Settings(**sections)  # type: ignore[arg-type]
