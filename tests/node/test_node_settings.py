"""The node's settings file as the live node reads it: sections, nested keys, one-line errors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import tomli_w

from gwtf.errors import ConfigError, WalletError
from gwtf.node import settings as node_settings
from gwtf.node.chain.wallet import load_or_create_node_key
from gwtf.node.composition import live_config_from_settings
from gwtf.node.p2p.identity import node_address_of_peer, peer_id_of
from gwtf.node.settings import AUTO_STAGE, load_settings
from gwtf.node.training import settings as training_settings

NODE_FILE: dict[str, dict[str, Any]] = {
    "node": {"name": "relay-2-1", "role": "relay", "stage": 2, "capacity": 3},
    "p2p": {
        "region": "tokyo",
        "bootstrap_peers": ["/ip4/127.0.0.1/tcp/4001/p2p/12D3KooWQxPoZRk7eqs81JrPWUiaPgLmkAEH"],
        "discovery_period_s": 0.5,
    },
    "chain": {"run_id": 7},
    "training": {
        "model": "llama-tiny",
        "stages": 3,
        "batch_size": 4,
        "seq_len": 16,
        "seed": 9,
        "device": "cpu",
        "max_in_flight": 8,
        "optimizer": {"lr": 0.01, "warmup_steps": 2},
    },
    "flow": {"routing": "swarm", "hop_ack_deadline_s": 4.0, "cooling_factor": 0.9},
}


PASSWORD = "node key password"


def write(tmp_path: Path, data: dict[str, Any], name: str = "node.toml") -> Path:
    """The settings file of ``data``, with the node's key (a real keystore) and password file."""
    key_file, password_file = tmp_path / "node-key.json", tmp_path / "password"
    if not key_file.exists():
        load_or_create_node_key(key_file, PASSWORD, scrypt_n=2**4)
        password_file.write_text(PASSWORD + "\n")
    node = {"key_file": str(key_file), "password_file": str(password_file), **data.get("node", {})}
    path = tmp_path / name
    path.write_text(tomli_w.dumps({**data, "node": node}))
    return path


def test_one_training_settings_class_serves_the_settings_and_the_engine() -> None:
    assert node_settings.TrainingSettings is training_settings.TrainingSettings
    assert node_settings.Settings().training == training_settings.TrainingSettings()


def test_a_node_file_maps_onto_the_live_node(tmp_path: Path) -> None:
    settings = load_settings(env={}, config_file=write(tmp_path, NODE_FILE))
    config = live_config_from_settings(settings)
    assert (config.name, config.role, config.stage, config.capacity) == ("relay-2-1", "relay", 2, 3)
    assert config.region == "tokyo"
    # The node key from its keystore is the node's libp2p identity: its peer id names the node.
    key = load_or_create_node_key(tmp_path / "node-key.json", PASSWORD)
    assert node_address_of_peer(peer_id_of(config.identity)) == key.address
    assert config.bootstrap == tuple(NODE_FILE["p2p"]["bootstrap_peers"])
    assert (config.stages, config.batch_size, config.seq_len, config.seed) == (3, 4, 16, 9)
    assert config.emulated_speed == 1.0
    assert config.model.d_model > 0 and config.routing == "swarm" and config.run_id == 7
    assert config.training.optimizer.lr == 0.01 and config.training.optimizer.warmup_steps == 2
    assert config.training.device == "cpu" and config.training.max_in_flight == 8
    # The flow section's names map onto the protocol's FlowConfig.
    assert config.flow.ack_deadline_s == 4.0 and config.flow.cooling == 0.9
    assert config.flow.stages == 3
    # Slot lists (which double as keep-alives) go at the keep-alive interval: 20 s / 2 s.
    assert config.flow.reconcile_periods == 10
    assert config.flow.activation_bytes == 4.0 * 4 * 16 * config.model.d_model
    assert config.admit is None, "admission is off unless chain.admission is set"


def test_a_data_node_with_a_home_keeps_its_resume_points_there_per_run(tmp_path: Path) -> None:
    home = tmp_path / "home"
    data_node = with_change("node", "role", "data", stage=0, data_dir=str(home))
    settings = load_settings(env={}, config_file=write(tmp_path, data_node))
    config = live_config_from_settings(settings)
    assert config.resume_dir == home / "checkpoints" / "run-7"
    assert config.training.checkpoint_every == 1
    # A relay keeps none; nor does a data node without a home.
    relay = load_settings(env={}, config_file=write(tmp_path, with_change("node", "data_dir", "x")))
    homeless = with_change("node", "role", "data", stage=0)
    assert live_config_from_settings(relay).resume_dir is None
    no_home = load_settings(env={}, config_file=write(tmp_path, homeless))
    assert live_config_from_settings(no_home).resume_dir is None


def test_a_node_without_its_keys_password_refuses_to_start_in_one_line(tmp_path: Path) -> None:
    data = with_change("node", "password_file", str(tmp_path / "missing"))
    settings = load_settings(env={}, config_file=write(tmp_path, data))
    with pytest.raises(WalletError) as info:
        live_config_from_settings(settings)
    assert "cannot read password file" in str(info.value) and info.value.exit_code == 4


def test_nested_optimizer_keys_come_from_the_environment_too(tmp_path: Path) -> None:
    env = {"GWTF_TRAINING_OPTIMIZER_LR": "0.002", "GWTF_NODE_ROLE": "data"}
    settings = load_settings(env=env, config_file=write(tmp_path, {}))
    assert settings.training.optimizer.lr == 0.002 and settings.node.role == "data"
    assert settings.describe()["training"]["optimizer"]["lr"] == 0.002  # type: ignore[index]


def test_a_relays_per_peer_limits_come_from_the_p2p_settings(tmp_path: Path) -> None:
    data = with_change("p2p", "relay_peer_bytes_per_s", 3 << 20, relay_peer_burst_bytes=1 << 20)
    env = {"GWTF_P2P_RELAY_CIRCUITS_PER_PEER": "3"}
    limits = live_config_from_settings(
        load_settings(env=env, config_file=write(tmp_path, data))
    ).relay_limits
    assert (limits.peer_bytes_per_s, limits.peer_burst_bytes) == (3 << 20, 1 << 20)
    assert limits.circuits_per_peer == 3
    default = live_config_from_settings(
        load_settings(env={}, config_file=write(tmp_path, NODE_FILE, "plain.toml"))
    ).relay_limits
    assert (default.peer_bytes_per_s, default.peer_burst_bytes) == (2 << 20, 16 << 20)


def with_change(section: str, key: str, value: object, **more: object) -> dict[str, dict[str, Any]]:
    """NODE_FILE with ``section.key`` (and ``section.<more>``) changed."""
    data = {name: dict(values) for name, values in NODE_FILE.items()}
    data[section].update({key: value, **more})
    return data


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        (with_change("node", "role", "boss"), "node.role='boss' from"),
        (with_change("node", "emulated_speed", 1.5), "node.emulated_speed=1.5 from"),
        (with_change("node", "emulated_hop_ms", -1.0), "node.emulated_hop_ms=-1.0 from"),
        (with_change("training", "stages", 0), "training.stages=0 from"),
        (with_change("training", "model", "tiny"), "training.model='tiny' from"),
        (with_change("training", "device", 3), "training.device=3 from"),
        (with_change("flow", "routing", "random"), "flow.routing='random' from"),
        (with_change("training", "optimizer", {"lr": 1e-4, "min_lr": 1e-3}), "min_lr"),
        (with_change("training", "optimizer", {"lrr": 1.0}), "training.optimizer.lrr"),
        (with_change("training", "data_shard", 1), "training.data_shard=1 must be within"),
        (with_change("training", "data_nodes", 0), "training.data_nodes=0 from"),
        (with_change("training", "checkpoint_every", -1), "training.checkpoint_every=-1"),
        (with_change("p2p", "relay_peer_bytes_per_s", 500_000), "must be at least 1048576"),
        (with_change("p2p", "relay_circuits_per_peer", 0), "p2p.relay_circuits_per_peer=0"),
        (with_change("p2p", "relay_circuits_per_peer", 9), "must be within 1..8"),
        (with_change("p2p", "relay_peer_burst_bytes", 1), "must be at least 65536"),
    ],
)
def test_bad_values_are_refused_with_one_line_naming_the_key(
    tmp_path: Path, data: dict[str, dict[str, Any]], fragment: str
) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(env={}, config_file=write(tmp_path, data))
    assert fragment in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        (with_change("node", "stage", 4), "node.stage=4 is not a relay stage of this run"),
        (with_change("node", "stage", 0), "node.stage=0 is not a relay stage"),
        (with_change("training", "model", "gpt-huge"), "training.model='gpt-huge'"),
        (with_change("training", "seq_len", 128), "seq_len=128 is longer than llama-tiny"),
        (with_change("p2p", "topology_file", "nowhere.json"), "p2p.topology_file="),
        (
            with_change(
                "p2p",
                "topology_file",
                "gwtf/coordinator_free/sim/data/regions-10.json",
                region="mars",
            ),
            "p2p.region='mars' is not a region of",
        ),
        (with_change("training", "stages", 5), "cannot split 4 layers into 5 non-empty stages"),
        (with_change("chain", "admission", True), "chain.admission"),
    ],
)
def test_settings_the_live_node_cannot_run_with_name_the_key(
    tmp_path: Path, data: dict[str, dict[str, Any]], fragment: str
) -> None:
    if fragment == "chain.admission":
        data["chain"] = {"admission": True}  # no run id
    settings = load_settings(env={}, config_file=write(tmp_path, data))
    with pytest.raises(ConfigError) as info:
        live_config_from_settings(settings)
    assert fragment in str(info.value) and "\n" not in str(info.value)


def test_a_relay_at_stage_minus_one_is_placed_when_it_starts(tmp_path: Path) -> None:
    settings = load_settings(env={}, config_file=write(tmp_path, with_change("node", "stage", -1)))
    assert live_config_from_settings(settings).stage == AUTO_STAGE


def test_reading_settings_does_not_import_torch() -> None:
    code = "import sys, gwtf.node.settings; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("example", sorted(Path("gwtf/node/swarm/examples").glob("*.toml")))
def test_the_example_swarm_files_load_and_their_node_files_validate(
    example: Path, tmp_path: Path
) -> None:
    from gwtf.node.swarm.plan import node_settings, plan_from_file, write_node_settings

    plan = plan_from_file(example, tmp_path)
    # Each node's settings file, as the swarm writes it (chain facts aside), loads back.
    for role, stage in (("data", 0), ("relay", 1)):
        written = write_node_settings(plan, node_settings(plan, f"{role}-x", role, stage, 0))
        settings = load_settings(env={}, config_file=written)
        assert settings.node.role == role and settings.training.stages == plan.run["stages"]
        assert settings.flow.routing == plan.run["routing"]


def test_a_swarm_file_data_set_trains_its_data_nodes_and_sizes_its_relays(tmp_path: Path) -> None:
    """The data nodes get the data set; the relays, without it, its vocabulary; the run
    commits to its manifest's hash and to that vocabulary."""
    from gwtf.node.chain.actions import RunModel, dataset_hash_of
    from gwtf.node.swarm.plan import (
        node_settings,
        plan_from_file,
        run_model_of,
        write_node_settings,
    )
    from gwtf.node.training.prepare import PrepareOptions, prepare

    (tmp_path / "c.txt").write_text("".join(f"document {i} of the corpus.\n\n" for i in range(99)))
    manifest = prepare(
        PrepareOptions((tmp_path / "c.txt",), tmp_path / "set", train_vocab=280)
    ).manifest
    (tmp_path / "swarm.toml").write_text(f'[run]\ndata = "{tmp_path / "set"}"\n')
    plan = plan_from_file(tmp_path / "swarm.toml", tmp_path / "out")
    loaded = {}
    for role, stage in (("data", 0), ("relay", 1)):
        written = write_node_settings(plan, node_settings(plan, f"{role}-x", role, stage, 0))
        loaded[role] = load_settings(env={}, config_file=written).training
    assert loaded["data"].data == str(tmp_path / "set")
    assert not loaded["relay"].data and loaded["relay"].vocab_size == manifest.vocab_size
    run = run_model_of(plan)
    assert run == RunModel.of(loaded["data"]) == RunModel.of(loaded["relay"])
    assert run.vocab_size == manifest.vocab_size
    assert dataset_hash_of(plan.run["data"]).hex() == manifest.digest


def test_a_swarm_file_vocabulary_sizes_every_node_without_a_data_set(tmp_path: Path) -> None:
    """``[run] vocab_size`` (GPT-2's 50,257 here): data node and relays build that model on the
    shipped corpus, and the run commits to it."""
    from gwtf.node.chain.actions import RunModel
    from gwtf.node.swarm.plan import (
        node_settings,
        plan_from_file,
        run_model_of,
        write_node_settings,
    )

    (tmp_path / "swarm.toml").write_text('[run]\nmodel = "gpt-125m"\nvocab_size = 50257\n')
    plan = plan_from_file(tmp_path / "swarm.toml", tmp_path / "out")
    for role, stage in (("data", 0), ("relay", 1)):
        written = write_node_settings(plan, node_settings(plan, f"{role}-x", role, stage, 0))
        training = load_settings(env={}, config_file=written).training
        assert not training.data and training.vocab_size == 50257
        assert RunModel.of(training) == run_model_of(plan)


def test_a_node_placed_on_another_host_listens_there_with_its_region_and_command_prefix(
    tmp_path: Path,
) -> None:
    """A swarm node with a ``NodeHost`` (the internet test bed's namespaces) gets that host's
    listen addresses and region in its settings, and its process starts under the prefix; the
    others stay on loopback."""
    from gwtf.node.p2p.addresses import LOOPBACK
    from gwtf.node.swarm.plan import NodeHost, node_settings, plan_from_file
    from gwtf.node.swarm.run import start_node

    (tmp_path / "swarm.toml").write_text("[chain]\nenabled = false\n")
    plan = plan_from_file(tmp_path / "swarm.toml", tmp_path / "out")
    # The prefix runs in place of the node: it prints the command it was given.
    echo = (sys.executable, "-c", "import sys; print(' '.join(sys.argv[1:]))")
    plan.hosts["relay-1-0"] = NodeHost(echo, ("/ip4/0.0.0.0/tcp/4001",), "tokyo")
    placed = node_settings(plan, "relay-1-0", "relay", 1, 0)
    assert placed["p2p"]["listen"] == ["/ip4/0.0.0.0/tcp/4001"]
    assert placed["p2p"]["region"] == "tokyo"
    local = node_settings(plan, "relay-1-1", "relay", 1, 1)
    assert local["p2p"]["listen"] == [LOOPBACK] and local["p2p"]["region"] == "oregon"
    with (tmp_path / "log").open("wb") as log:
        start_node(plan, placed, log).popen.wait(timeout=30)
    assert (tmp_path / "log").read_text().split()[:3] == [sys.executable, "-m", "gwtf.node.process"]


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ("[flow]\nack_deadline_s = 2.0\n", "unknown keys ['ack_deadline_s'] in [flow]"),
        ("[flow]\nhop_ack_deadline_s = -1.0\n", "flow.hop_ack_deadline_s=-1.0"),
        ("[run]\nrouting = 'random'\n", "flow.routing='random'"),
        ("[chain]\nenabled = false\n[churn]\nevents = [{t = 1.0, stranger = 1}]\n", "stranger"),
        ("[churn]\nevents = [{t = 1.0, leave = 1}]\n", "names none of"),
        ("[swarm]\ndata_nodes = 0\n", "[swarm] data_nodes = 0"),
        ("[run]\niterations = 0\n", "[run] iterations = 0"),
        ("[run]\nbatch_size = 1.5\n", "[run] batch_size = 1.5"),
        ("[swarm]\nspeeds = []\n", "[swarm] speeds = []"),
        ("[swarm]\nrelays_per_stage = 0\n", "[swarm] relays_per_stage = 0"),
        ("[swarm]\nregions = []\n", "[swarm] regions = []"),
        (
            "[swarm]\nregions = ['mars']\n"
            "topology = 'gwtf/coordinator_free/sim/data/regions-10.json'\n",
            "[swarm] regions ['mars'] are not in",
        ),
        ("[run]\nstages = 10\n", "[run] cannot split 4 layers into 10 non-empty stages"),
        ("[swarm]\nspeeds = [1.0, 1.5]\n", "[swarm] speeds = [1.0, 1.5]"),
        ("[run]\nseq_len = 128\n", "[run] seq_len=128 is longer than gpt-tiny's context of 64"),
        ("[run]\nmodel = 'gpt-huge'\n", "[run] unknown gpt size 'huge'"),
        ("[run]\nseq_len = '32'\n", "seq_len and stages whole numbers"),
        ("[run]\nvocab_size = -1\n", "[run] vocab_size is a whole number"),
        ("[churn]\nevents = [{kill = 'data'}]\n", "needs a time t in seconds"),
        ("[churn]\nevents = [{t = 1.0, restart = 'data'}]\n", "only after a kill event"),
        ("[churn]\nevents = [{t = 1.0, leave = 'data'}]\n", "'stranger', 'restart'"),
        ("[churn]\nevents = [{t = 1.0, join = 3}]\n", "churn event stage 3"),
        ("[churn]\nevents = [{t = 1.0, stranger = 'auto'}]\n", "a stranger cannot ask"),
        ("[churn]\ncrash_on = [{stage = 1, iteration = 1}]\n", "needs direction"),
        (
            "[churn]\ncrash_on = [{stage = 1, direction = 'forward', iteration = 1, when = 'x'}]\n",
            "'when' is one of on_receipt, after_ack",
        ),
    ],
)
def test_bad_swarm_files_are_refused_naming_the_key(
    body: str, fragment: str, tmp_path: Path
) -> None:
    from gwtf.node.swarm.plan import node_settings, plan_from_file, write_node_settings

    swarm_file = tmp_path / "swarm.toml"
    swarm_file.write_text(body)
    with pytest.raises(ConfigError) as info:
        plan = plan_from_file(swarm_file, tmp_path / "out")
        write_node_settings(plan, node_settings(plan, "relay-1-0", "relay", 1, 0))
    assert fragment in str(info.value) and "\n" not in str(info.value)
