"""Settings: precedence, validation messages, and secrets that never leak."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from gwtf.errors import ConfigError
from gwtf.node.settings import Secret, Settings, load_settings


def write_toml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "gwtf.toml"
    path.write_text(text)
    return path


def test_defaults_load_and_are_valid(tmp_path: Path) -> None:
    settings = load_settings(env={}, config_file=write_toml(tmp_path, ""))
    assert settings == Settings()
    assert settings.api.host == "127.0.0.1"
    assert settings.flow.temperature_relay == 0.001


def test_precedence_cli_over_env_over_toml_over_default(tmp_path: Path) -> None:
    toml = write_toml(tmp_path, "[api]\nport = 1111\nhost = '0.0.0.0'\n[log]\nlevel = 'DEBUG'\n")
    env = {"GWTF_API_PORT": "2222", "GWTF_LOG_LEVEL": "WARNING"}
    settings = load_settings({"api.port": 3333, "log.level": None}, env=env, config_file=toml)
    assert settings.api.port == 3333  # flag
    assert settings.log.level == "WARNING"  # env (the flag was not given)
    assert settings.api.host == "0.0.0.0"  # toml
    assert settings.db.url.startswith("sqlite:///")  # default


def test_env_strings_are_converted_to_field_types(tmp_path: Path) -> None:
    env = {
        "GWTF_API_ENABLED": "false",
        "GWTF_FLOW_COOLING_FACTOR": "0.9",
        "GWTF_P2P_BOOTSTRAP_PEERS": "/ip4/1.2.3.4/tcp/1, /ip4/5.6.7.8/tcp/2",
    }
    settings = load_settings(env=env, config_file=write_toml(tmp_path, ""))
    assert settings.api.enabled is False
    assert settings.flow.cooling_factor == 0.9
    assert settings.p2p.bootstrap_peers == ("/ip4/1.2.3.4/tcp/1", "/ip4/5.6.7.8/tcp/2")


def test_a_node_listens_everywhere_by_default_and_takes_several_addresses(tmp_path: Path) -> None:
    assert Settings().p2p.listen == ("/ip4/0.0.0.0/tcp/0",)
    env = {
        "GWTF_P2P_LISTEN": "/ip4/0.0.0.0/tcp/4001,/ip6/::/tcp/4001",
        "GWTF_P2P_ANNOUNCE": "/ip4/203.0.113.7/tcp/4001,/dns4/home.example/tcp/4001",
    }
    p2p = load_settings(env=env, config_file=write_toml(tmp_path, "")).p2p
    assert p2p.listen == ("/ip4/0.0.0.0/tcp/4001", "/ip6/::/tcp/4001")
    assert p2p.announce == ("/ip4/203.0.113.7/tcp/4001", "/dns4/home.example/tcp/4001")


def test_reachable_is_auto_by_default_and_can_be_forced(tmp_path: Path) -> None:
    assert Settings().p2p.reachable == "auto"
    for given, read in (("auto", "auto"), ("false", False), ("yes", True)):
        env = {"GWTF_P2P_REACHABLE": given}
        assert load_settings(env=env, config_file=write_toml(tmp_path, "")).p2p.reachable == read
    toml = write_toml(tmp_path, "[p2p]\nreachable = false\n")
    assert load_settings(env={}, config_file=toml).p2p.reachable is False


@pytest.mark.parametrize(
    ("env", "fragment"),
    [
        ({"GWTF_P2P_REACHABLE": "maybe"}, 'is not "auto", true or false'),
        ({"GWTF_API_PORT": "70000"}, "api.port=70000 from the environment must be a TCP port"),
        ({"GWTF_API_PORT": "eighty"}, "api.port='eighty' from the environment is not an integer"),
        ({"GWTF_FLOW_COOLING_FACTOR": "1.5"}, "flow.cooling_factor=1.5"),
        ({"GWTF_CHAIN_RPC_URL": "localhost:8545"}, "must be an http:// or https://"),
        ({"GWTF_TRAINING_DEVICE": "tpu"}, "must be one of auto, cpu, cuda"),
        ({"GWTF_DB_URL": "mysql://x"}, "must be a sqlite:///PATH or postgresql://"),
        ({"GWTF_API_ENABLED": "maybe"}, "is not a boolean"),
        ({"GWTF_CHAIN_BATCH_MAX_HOPS": "5000"}, "must be 1 to 4096 hops a batch"),
        ({"GWTF_CHAIN_BATCH_MAX_AGE_S": "0"}, "at most 300 seconds"),
        ({"GWTF_CHAIN_BATCH_CLOSE_TIMEOUT_S": "301"}, "at most 300 seconds"),
        ({"GWTF_P2P_LISTEN": "/ip4/0.0.0.0/udp/1"}, "listen address '/ip4/0.0.0.0/udp/1' is not"),
        ({"GWTF_P2P_LISTEN": ""}, "must name at least one address"),
        ({"GWTF_P2P_ANNOUNCE": "/ip4/0.0.0.0/tcp/4001"}, "names no host; give the public IP"),
        ({"GWTF_P2P_ANNOUNCE": "/dns4/home.example/tcp/0"}, "has port 0"),
        ({"GWTF_P2P_RELAYS": "/ip4/203.0.113.7/tcp/4001"}, "is not HOST/tcp/PORT/p2p/ID"),
        ({"GWTF_P2P_RELAYS": "relay.example:4001"}, "bad relay address 'relay.example:4001'"),
    ],
)
def test_bad_values_name_the_value_and_the_fix(
    tmp_path: Path, env: dict[str, str], fragment: str
) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(env=env, config_file=write_toml(tmp_path, ""))
    message = str(info.value)
    assert fragment in message
    assert "\n" not in message
    assert "fix it in the environment" in message


def test_toml_errors_name_the_file(tmp_path: Path) -> None:
    bad_type = write_toml(tmp_path, "[p2p]\ndiscovery_period_s = 'x'\n")
    with pytest.raises(
        ConfigError, match=r"p2p.discovery_period_s='x' from .*gwtf.toml is not a number"
    ):
        load_settings(env={}, config_file=bad_type)
    typo = write_toml(tmp_path, "[p2p]\nlisten_prot = 1\n")
    with pytest.raises(ConfigError, match=r"unknown setting p2p\.listen_prot"):
        load_settings(env={}, config_file=typo)
    section = write_toml(tmp_path, "[gpu]\nx = 1\n")
    with pytest.raises(ConfigError, match=r"unknown section \[gpu\]"):
        load_settings(env={}, config_file=section)
    broken = write_toml(tmp_path, "[p2p\n")
    with pytest.raises(ConfigError, match="is not valid TOML"):
        load_settings(env={}, config_file=broken)


def test_missing_explicit_config_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_settings(env={}, config_file=tmp_path / "nope.toml")
    with pytest.raises(ConfigError, match="does not exist"):
        load_settings(env={"GWTF_CONFIG": str(tmp_path / "nope.toml")})


def test_secrets_are_refused_in_toml(tmp_path: Path) -> None:
    toml = write_toml(tmp_path, "[chain]\nrpc_token = 'hunter2hunter2'\n")
    with pytest.raises(ConfigError) as info:
        load_settings(env={}, config_file=toml)
    assert "must not be in" in str(info.value)
    assert "GWTF_RPC_TOKEN" in str(info.value)
    assert "hunter2hunter2" not in str(info.value)


def test_secret_from_env_never_shows_in_repr_describe_or_logs(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    token = "s3cr3t-token-value"
    settings = load_settings(env={"GWTF_RPC_TOKEN": token}, config_file=write_toml(tmp_path, ""))
    assert settings.chain.rpc_token == Secret(token)
    assert settings.chain.rpc_token is not None
    assert settings.chain.rpc_token.reveal() == token
    with caplog.at_level(logging.DEBUG):
        logging.getLogger("gwtf.test").info("settings %s %r", settings, settings.describe())
    shown = [repr(settings), str(settings), repr(settings.describe()), caplog.text]
    assert all(token not in text for text in shown)
    assert settings.describe()["chain"]["rpc_token"] == "***"


def test_settings_are_frozen(tmp_path: Path) -> None:
    settings = load_settings(env={}, config_file=write_toml(tmp_path, ""))
    with pytest.raises(AttributeError):
        settings.api.port = 1  # type: ignore[misc]
