"""A node whose part does not fit its memory says so in one line before it serves; a relay
without a stage joins only a stage that fits, and says so when none does; a running node shows
its part's memory in its status."""

from __future__ import annotations

from contextlib import AsyncExitStack
from dataclasses import replace
from pathlib import Path

import pytest
import trio

from gwtf.node.chain.wallet import load_or_create_node_key
from gwtf.node.cli.nodes import _live_fields
from gwtf.node.local_api.snapshot import Meter, SnapshotBox, take_snapshot
from gwtf.node.p2p.host import full_address, running_host
from gwtf.node.p2p.identity import new_identity
from gwtf.node.p2p.rpc import RequestResponse, RpcLimits
from gwtf.node.process import main
from gwtf.node.runtime.dataplane import control
from gwtf.node.runtime.discovery.join_placement import choose_join_stage
from gwtf.node.runtime.live_node import run_live_node, stages_that_fit
from gwtf.node.training.config import named_config
from gwtf.node.training.memory import StageMemoryError, part_memory
from gwtf.node.training.partition import plan_partition
from gwtf.node.training.settings import TrainingSettings
from tests.runtime.swarm_harness import TRAINING, node_config

PASSWORD = "correct horse"
#: gpt-tiny's 4 blocks in 3 stages: 1, 1 and 2.
STAGES = 3
PLAN = plan_partition(named_config("gpt", "tiny"), STAGES)


def tight_training(max_in_flight: int = 64) -> TrainingSettings:
    """Settings under which stage 3 does not fit and stages 1 and 2 do."""
    settings = replace(TRAINING, max_in_flight=max_in_flight)
    big, small = (part_memory(PLAN, stage, settings).total for stage in (3, 1))
    cap_mib = (big + small) // 2 // 2**20
    assert small < cap_mib * 2**20 < big, (small, big)
    return replace(settings, memory_limit_mib=cap_mib)


def leaves(error: BaseException) -> list[BaseException]:
    if isinstance(error, BaseExceptionGroup):
        return [leaf for inner in error.exceptions for leaf in leaves(inner)]
    return [error]


def test_a_relay_whose_stage_does_not_fit_is_refused_before_it_serves(tmp_path: Path) -> None:
    training = tight_training()
    config = node_config(tmp_path, "relay", "relay", 3, STAGES, training=training)
    with pytest.raises(BaseException) as raised:  # a group from the host's nursery
        trio.run(run_live_node, config)
    (error,) = leaves(raised.value)
    assert isinstance(error, StageMemoryError)
    message = str(error)
    assert "\n" not in message and message.startswith("stage 3 needs ")
    assert f"training.memory_limit_mib = {training.memory_limit_mib}" in message
    # The same node fits the stages of one block.
    assert stages_that_fit(replace(config, stage=-1)) == (1, 2)


def test_no_stage_that_fits_is_said_in_one_line(tmp_path: Path) -> None:
    config = node_config(
        tmp_path, "relay", "relay", -1, STAGES, training=replace(TRAINING, memory_limit_mib=1)
    )
    with pytest.raises(StageMemoryError) as refused:
        stages_that_fit(config)
    message = str(refused.value)
    assert message.startswith("no stage of this run fits this node: stage 1 needs ")
    assert "\n" not in message and "lower training.max_in_flight" in message


def test_a_joiner_takes_the_bottleneck_among_the_stages_that_fit() -> None:
    """Real hosts on 127.0.0.1: a data node, a replica of stage 1 (capacity 2) and one of
    stage 2 (capacity 1); stage 3, empty, is the bottleneck, but a joiner whose memory holds
    stages 1 and 2 only takes stage 2, the smaller of those."""

    async def main() -> tuple[int, int]:
        async with AsyncExitStack() as stack:
            hosts = {
                name: await stack.enter_async_context(running_host(new_identity()))
                for name in ("data", "a", "b", "joiner")
            }
            ids = {name: str(host.get_id()) for name, host in hosts.items()}
            addr = {name: full_address(host) for name, host in hosts.items()}
            rows = [
                control.LoadEntry(ids["data"], addr["data"], 0, 4, 4, 10.0),
                control.LoadEntry(ids["a"], addr["a"], 1, 2, 2, 10.0),
                control.LoadEntry(ids["b"], addr["b"], 2, 1, 1, 10.0),
            ]

            async def answer(_peer: str, _request: bytes) -> bytes:
                return control.encode_loads(rows)

            limits = RpcLimits(control.MAX_BYTES, control.MAX_BYTES, 10.0)
            for name in ("data", "a", "b"):
                RequestResponse(hosts[name]).serve(control.PROTOCOL_ID, answer, limits)
            joiner = RequestResponse(hosts["joiner"])
            with trio.fail_after(60):
                free = await choose_join_stage(joiner, (addr["data"],), STAGES, 2.0)
                held = await choose_join_stage(joiner, (addr["data"],), STAGES, 2.0, (1, 2))
            return free.decision.stage, held.decision.stage

    assert trio.run(main) == (3, 2)


def test_a_node_process_says_in_one_line_that_its_stage_does_not_fit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    key = tmp_path / "key.json"
    load_or_create_node_key(key, PASSWORD, scrypt_n=2**4)
    monkeypatch.setenv("GWTF_WALLET_PASSWORD", PASSWORD)
    config = tmp_path / "relay.toml"
    config.write_text(
        f'[node]\nrole = "relay"\nstage = 1\nkey_file = "{key}"\n'
        '[p2p]\nlisten = ["/ip4/127.0.0.1/tcp/0"]\nupnp = false\n'
        "[api]\nport = 0\n"  # 8787 may be another node's
        '[training]\nmodel = "gpt-small"\nstages = 2\ndevice = "cpu"\nmemory_limit_mib = 4\n'
    )
    code = main(["--config", str(config), "--status-file", str(tmp_path / "s.json")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code != 0
    assert err[-1].startswith("gwtf-node: error: stage 1 needs "), err
    assert "more than the 4.0 MiB of training.memory_limit_mib = 4" in err[-1]
    assert not any("Traceback" in line for line in err)


def test_the_status_shows_the_parts_memory(tmp_path: Path) -> None:
    """A data node and a relay of each stage, live on 127.0.0.1: each one's status carries its
    part's memory, as computed, and ``gwtf-node status`` puts it in one line."""
    seen: dict[str, object] = {}

    async def main() -> None:
        from tests.runtime.swarm_harness import Swarm, run_swarm

        swarm = Swarm()

        async def look(swarm: Swarm) -> None:
            while len(swarm.nodes) < 3:
                await trio.sleep(0.05)
            for name, node in swarm.nodes.items():
                seen[name] = take_snapshot(node, SnapshotBox(), Meter()).status

        with trio.fail_after(120):
            await run_swarm(tmp_path, 1, 2, {"a": 1, "b": 2}, look, swarm)

    trio.run(main)
    plan = plan_partition(named_config("gpt", "tiny"), 2)
    for name, part in (("data", 0), ("a", 1), ("b", 2)):
        status = seen[name]
        memory = status.memory  # type: ignore[attr-defined]
        expected = part_memory(plan, part, TRAINING)
        assert memory.total_bytes == expected.total and memory.in_flight == 8
        assert memory.activations_per_microbatch_bytes == expected.activations_per_microbatch
        assert memory.budget_source == "available RAM" and memory.budget_bytes > memory.total_bytes
    line = _live_fields(seen["a"].model_dump())["memory"]  # type: ignore[attr-defined]
    assert line.startswith(f"{part_memory(plan, 1, TRAINING).total / 2**20:,.1f} MiB (weights ")
    assert "8 microbatches in flight) of " in line and "(available RAM)" in line
