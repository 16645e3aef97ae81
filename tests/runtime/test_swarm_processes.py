"""A swarm of real OS processes on loopback, with its chain: relays die by SIGKILL mid-hop, a
registered relay joins, and a process whose libp2p id is not on chain is refused by everyone;
every hop leaves a receipt and the epochs are certified and claimed on chain, a relay killed and
restarted included; two data nodes share a run and one comes back after a SIGKILL. All of them
are `slow` (a devnet and four to seven OS processes each): the default run covers the same end to
end on a small case with `gwtf-node demo --quick` (tests/node/test_demo.py: a crash, a join,
the audit slashing a cheater, every node paid), `gwtf-node swarm`
(tests/node/test_swarm_command.py) and re-execution with its tensor dispute over real hosts
(tests/contracts/test_reexecution_audit.py)."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

import pytest

from gwtf.node.store.database import open_database
from gwtf.node.store.hops import HopStore
from gwtf.node.swarm.exactness import against_whole_model
from gwtf.node.swarm.plan import plan_from_file
from gwtf.node.swarm.run import run_swarm


def swarm_of(tmp_path: Path, swarm_file: str, timeout_s: float) -> dict[str, Any]:
    """Run the swarm of ``swarm_file`` (its text) in ``tmp_path``; its summary."""
    path = tmp_path / "swarm.toml"
    path.write_text(swarm_file)
    plan = plan_from_file(path, tmp_path / "out")
    with (tmp_path / "swarm.log").open("wb") as log:
        return run_swarm(plan, log, timeout_s=timeout_s)


SWARM_FILE = """
[run]
iterations = 16
microbatches_per_iteration = 4
seed = 5
[swarm]
relays_per_stage = 2
capacity = 1
[churn]
# Stage 1 loses a relay as a forward arrives (its sender sees it and re-sends); stage 2 one
# that has acknowledged a backward and dies before sending the gradient on (nobody sees it: the
# data node's trace of the late microbatch finds it, and the gradient goes around the dead relay).
# Once the joiner serves, stage 1's other first relay dies at the next forward it gets (if the
# flows still send it any): either way the joiner carries stage 1's flow from then on.
crash_on = [
  {stage = 1, direction = "forward", iteration = 1},
  {stage = 2, direction = "backward", iteration = 2, when = "after_ack"},
  {stage = 1, direction = "forward", iteration = 6},
]
# The joiner is registered on chain just before it enters; the stranger never is.
events = [{t = 0.0, join = 1}, {t = 0.0, stranger = 1}]
[chain]
epochs = 2
"""


@pytest.mark.slow  # a devnet and seven OS processes each loading torch: ~2-3 minutes on two cores
def test_swarm_on_chain_survives_sigkills_takes_in_a_joiner_and_refuses_a_stranger(
    tmp_path: Path,
) -> None:
    summary = swarm_of(tmp_path, SWARM_FILE, timeout_s=400)

    assert summary == json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["iterations"] == 16
    assert summary["microbatches"] == 64, "no microbatch of any iteration is lost"
    injected = {c["node"] for c in summary["crashes"] if c.get("injected")}
    assert len(injected & {"relay-1-0", "relay-1-1"}) >= 1 and len(injected) in (2, 3), injected
    assert len(injected & {"relay-2-0", "relay-2-1"}) == 1, injected
    recovered = summary["recovered_hops"]
    # Only the lost hops are recomputed: a hop lost after its ack (forward or gradient) is sent
    # again past the dead relay; no microbatch starts again.
    assert recovered["restarted_microbatches"] == 0
    assert summary["stages_not_stepped"] == 0, "every stage stepped every iteration"
    assert recovered["forward_resends"] >= 1
    assert recovered["gradient_resumes"] >= 1
    assert recovered["backward_repairs"] >= 1
    relays = summary["relays"]
    joiner = relays["joiner-1-0"]
    # The swarm held the data node until the joiner served, so it was there to take stage 1's
    # flow over.
    assert summary["joins"][0]["serving"], summary["joins"]
    assert joiner["step"] == 16 and joiner["hops_recorded"] > 0, "the joiner took traffic"
    for stage in (1, 2):
        digests = {r["state_digest"] for r in relays.values() if r["stage"] == stage}
        steps = {r["step"] for r in relays.values() if r["stage"] == stage}
        assert steps == {16}
        assert len(digests) == 1, f"stage {stage} replicas differ"
    assert summary["replicas_out_of_step"] == []
    # Nothing the kills took is lost: it trained like the whole model, iteration by iteration.
    exactness = against_whole_model(tmp_path / "out", summary)
    assert exactness["worst_relative_difference"] < 1e-4, exactness
    assert summary["work"]["gradients_lost"] == 0

    chain = summary["chain"]
    assert chain["enabled"] and chain["run_id"] >= 1 and chain["rpc_url"].startswith("http://")
    registered = {node["node"]: node["peer_id"] for node in chain["registered_nodes"]}
    assert set(registered) == {"data", "joiner-1-0"} | {
        f"relay-{stage}-{replica}" for stage in (1, 2) for replica in (0, 1)
    }
    stranger = chain["strangers"]["stranger-1-0"]
    assert stranger["hops_recorded"] == 0, "no node sent the stranger a hop"
    refused = {entry["peer_id"]: entry for entry in chain["refused_peers"]}
    assert stranger["peer_id"] in refused, "the stranger tried to join and was refused"
    assert refused[stranger["peer_id"]]["node"] == "stranger-1-0"
    assert not refused[stranger["peer_id"]]["registered"]
    assert sum(refused[stranger["peer_id"]]["refused_by"].values()) >= 1
    assert not set(refused) & set(registered.values()), "no registered node was refused"
    # Every node ran from its own settings file with admission and receipts on.
    for name in registered:
        settings = tomllib.loads((tmp_path / "out" / f"{name}.toml").read_text())
        assert settings["chain"]["admission"] is True and settings["chain"]["receipts"] is True
        assert settings["chain"]["run_id"] == chain["run_id"]
    # Two epochs certified and claimed: every relay alive at the end claimed exactly its
    # certified units, those killed mid-hop claimed nothing, and each epoch adds up.
    assert all(epoch["adds_up"] for epoch in chain["epochs"])
    certified = certified_units(tmp_path / "out", chain["run_id"], len(chain["epochs"]))
    addresses = {node["node"]: node["node_address"] for node in chain["registered_nodes"]}
    earnings = chain["earnings"]
    for name in relays:
        assert earnings[name]["units"] == certified.get(addresses[name], 0), name
    assert earnings["joiner-1-0"]["units"] > 0, "the joiner was paid for its hops"
    killed = [c["node"] for c in summary["crashes"]]
    assert all(earnings[name]["units"] == 0 for name in killed)


RECEIPTS_FILE = """
[run]
iterations = 48
microbatches_per_iteration = 2
seed = 3
[swarm]
relays_per_stage = 2
capacity = 1
# Two relays sign two versions of a hop: one as its worker, one as its receiver.
cheaters = {"relay-1-0" = "claim-twice", "relay-2-1" = "equivocate"}
[chain]
epochs = 2
[churn]
# Training lasts 4-16 s: the relay has worked and reported (every second) for 1.5 s when it dies,
# and is started again (its process loads torch again) before training ends; it claims what its
# database holds once it is up, after training if need be.
events = [{t = 1.5, kill = "relay-1-1"}, {t = 2.0, restart = "relay-1-1"}]
"""


def certified_units(
    out: Path, run_id: int, epochs: int, data_nodes: tuple[str, ...] = ("data",)
) -> dict[str, int]:
    """Units per worker address in the data nodes' certificates, from their own databases."""
    units: dict[str, int] = {}
    for name in data_nodes:
        db = open_database(f"sqlite:///{out / f'{name}.sqlite'}")
        try:
            for epoch in range(epochs):
                for entry in HopStore(db).certified_hops(run_id, epoch):
                    worker = entry.receipt.worker
                    units[worker] = units.get(worker, 0) + entry.receipt.units
        finally:
            db.close()
    return units


@pytest.mark.slow  # a devnet and seven OS processes over 48 iterations: ~1-2 minutes on two cores
def test_every_hop_earns_the_audit_slashes_the_two_cheaters_and_pays_the_honest_to_the_wei(
    tmp_path: Path,
) -> None:
    summary = swarm_of(tmp_path, RECEIPTS_FILE, timeout_s=300)
    assert summary["iterations"] == 48 and summary["microbatches"] == 96
    assert [j["node"] for j in summary["joins"]] == ["relay-1-1"], "the relay came back"
    assert summary["joins"][0]["serving"], "and served again before training went on"
    assert summary["replicas_out_of_step"] == [], "it stepped with its stage again"
    # What the killed relay held was redone: it trained like the whole model.
    exactness = against_whole_model(tmp_path / "out", summary)
    assert exactness["worst_relative_difference"] < 1e-4, exactness
    assert summary["work"]["gradients_lost"] == 0
    chain = summary["chain"]
    epochs = chain["epochs"]
    assert [e["epoch"] for e in epochs][:2] == [0, 1], "training spanned two epochs"
    for epoch in epochs[:2]:
        assert epoch["certified_units"] > 0 and epoch["adds_up"], epoch
    # The audit over p2p, before the epochs settled: one equivocation per cheater per epoch it
    # cheated in, nobody else accused; the first proof slashed each, the next was judged.
    audit = chain["audit"]
    assert audit["peers_unread"] == {}
    assert audit["certificates"] == sum(len(e["certificates"]) for e in epochs)
    certified_count = sum(c["count"] for e in epochs for c in e["certificates"].values())
    assert audit["leaves_checked"] == certified_count > 0
    cheaters = {"relay-1-0": "as worker", "relay-2-1": "as counterparty"}
    accusations = [f for f in audit["findings"] if f["accused"]]
    assert {f["accused"] for f in accusations} == set(cheaters)
    # (In the second epoch audited, a cheater slashed for the first is judged already.)
    for f in accusations:
        assert f["kind"] == "equivocation" and (f["provable_on_chain"] or f["judged"]), f
    # Every finding accuses a cheater: every sampled hop could be re-executed, the hops the
    # kill made the swarm repair or redo included (a stand-in's recomputed forward is receipted
    # and certified like any other, so its backward replays).
    for f in audit["findings"]:
        assert f["accused"] and cheaters[f["accused"]] in f["detail"], f
    assert audit["epochs"] == [0, 1]
    # A sample of hops re-executed, each bit for bit (nobody returned a wrong tensor).
    assert audit["replayed"] > 0 and audit["replayed_exact"] == audit["replayed"]
    slashed = [
        c for c in audit["challenges"] if c["outcome"] == "slashed" and int(c["slashed_wei"]) > 0
    ]
    assert sorted(c["accused"] for c in slashed) == sorted(cheaters)
    # A cheater slashed for one epoch is proven at fault in the other too (its pay there is
    # burned), for no further stake; a finding of an epoch it is convicted in is judged already.
    assert all(
        c["outcome"] == "already judged"
        or (c["outcome"] == "slashed" and int(c["slashed_wei"]) == int(c["bounty_wei"]) == 0)
        for c in audit["challenges"]
        if c not in slashed
    )
    stake = 2 * 10**18
    assert all(int(c["slashed_wei"]) == stake for c in slashed)
    bounty = sum(int(c["bounty_wei"]) for c in slashed)
    assert int(audit["bounty_withdrawn_wei"]) == bounty == 2 * stake // 20
    assert int(audit["slashed_wei"]) == int(audit["burned_wei"]) + bounty
    # The honest relays, the restarted one included (from its own database, after its
    # restart), claimed exactly their certified units, at the epoch's one rate; the slashed
    # claimed nothing, and their stake is gone.
    addresses = {node["node"]: node["node_address"] for node in chain["registered_nodes"]}
    certified = certified_units(tmp_path / "out", chain["run_id"], len(epochs))
    earnings = chain["earnings"]
    for name in ("relay-1-1", "relay-2-0"):
        assert earnings[name]["units"] == certified.get(addresses[name], 0) > 0, name
        claims = earnings[name]["claims"]
        assert all(c["status"] == "confirmed" for c in claims), claims
        # The node's own API, from its database, says what the chain paid it.
        api = earnings[name]["api"]
        assert api["health"] in ("ok", "idle"), api  # idle: training is over
        assert api["claimed_wei"] == earnings[name]["reward_wei"], api
        assert len({(c["epoch"], c["data_node"]) for c in claims}) == len(claims)
    for name in cheaters:
        assert earnings[name]["units"] == 0 and earnings[name]["stake_wei"] == "0", name
    honest_units = sum(certified.get(addresses[n], 0) for n in ("relay-1-1", "relay-2-0"))
    assert sum(e["units"] for e in earnings.values()) == honest_units
    # Each epoch: what was claimed is what the ledger paid, each claim its units at the run's
    # price; claimed + burned + still claimable (the cheaters' share, burned when the claim
    # period ends) is the budget to the wei.
    paid = sum(int(e["reward_wei"]) for e in earnings.values())
    assert paid == sum(int(e["claimed_wei"]) for e in epochs)
    for epoch in epochs:
        parts = ("claimed_wei", "burned_wei", "unclaimed_wei")
        assert sum(int(epoch[k]) for k in parts) == int(epoch["budget_wei"]), epoch
        cheaters_at = [addresses[n] for n in cheaters]
        cheated = sum(
            certified_units_of(tmp_path / "out", chain["run_id"], epoch["epoch"], cheaters_at)
        )
        share = int(epoch["budget_wei"]) * cheated // max(1, epoch["certified_units"])
        assert int(epoch["unclaimed_wei"]) >= share
    receipts = earnings["relay-2-0"]["receipts"]
    assert receipts["signed"] > 0 and receipts["refused"] == 0


WRONG_TENSOR_FILE = """
[run]
iterations = 16
microbatches_per_iteration = 2
seed = 3
[swarm]
relays_per_stage = 2
capacity = 1
# Each forward output of relay-1-0 is 0.1 % off: only re-execution can tell.
cheaters = {"relay-1-0" = "wrong-tensor"}
[chain]
epochs = 2
# The certificates hold 32 microbatches x 2 stages x 2 directions = 128 hops in all: the audit
# re-executes every one, so it cannot miss the cheater's.
audit_sample = 128
"""


@pytest.mark.slow  # a devnet, OS processes and two juries, every hop re-executed: ~1-2 minutes
def test_a_wrong_tensor_is_found_by_re_execution_and_a_drawn_jury_slashes_its_worker(
    tmp_path: Path,
) -> None:
    summary = swarm_of(tmp_path, WRONG_TENSOR_FILE, timeout_s=300)
    audit = summary["chain"]["audit"]
    # Every hop was re-executed from the relays' evidence: every honest one bit for bit, the
    # cheater's forwards 1e-3 off.
    counts = [c["count"] for e in summary["chain"]["epochs"] for c in e["certificates"].values()]
    assert audit["sample_notes"] == [] and audit["replayed"] == sum(counts) > 0
    wrong = [f for f in audit["findings"] if f["kind"] == "wrong tensor"]
    assert audit["replayed_exact"] + len(wrong) == audit["replayed"]
    assert wrong and {f["accused"] for f in audit["findings"]} == {"relay-1-0"}
    assert all("relative error 1.00e-03" in f["detail"] for f in wrong)
    # One dispute per epoch the cheater worked in (each epoch with certified hops: it carries a
    # microbatch of every iteration), each opened with a bond; a drawn jury re-executed each.
    # The first slashes its stake; the second convicts it in the other epoch too (its pay there
    # is burned) for no further stake. An iteration is in the epoch the data node's clock read
    # as it began: the swarm holds it at each epoch's end until it has read the next, so both
    # epochs hold hops.
    disputed = [c for c in audit["challenges"] if c["outcome"] == "disputed"]
    epochs = len([e for e in summary["chain"]["epochs"] if e["certificates"]])
    assert epochs == 2, summary["chain"]["epochs"]
    assert len(disputed) == epochs and {c["accused"] for c in disputed} == {"relay-1-0"}
    first, *later = audit["rulings"]
    assert first["outcome"] == "wrong tensor: worker slashed" and len(later) == epochs - 1
    assert all(r["outcome"] == "wrong tensor: worker slashed before" for r in later)
    assert all(int(r["slashed_wei"]) == int(r["bounty_wei"]) == 0 for r in later)
    stake = 2 * 10**18
    assert int(first["slashed_wei"]) == stake and int(first["bounty_wei"]) == stake // 20
    # The auditor withdrew its bounty and every bond back; the rest of the stake is burned.
    assert int(audit["bounty_withdrawn_wei"]) == stake // 20 + epochs * 10**17
    assert int(audit["burned_wei"]) == stake - stake // 20
    # The honest relays are paid their certified units; the cheater nothing, its stake gone.
    chain = summary["chain"]
    addresses = {node["node"]: node["node_address"] for node in chain["registered_nodes"]}
    certified = certified_units(tmp_path / "out", chain["run_id"], len(chain["epochs"]))
    earnings = chain["earnings"]
    for name in ("relay-1-1", "relay-2-0", "relay-2-1"):
        assert earnings[name]["units"] == certified.get(addresses[name], 0), name
    assert earnings["relay-1-0"]["units"] == 0 and earnings["relay-1-0"]["stake_wei"] == "0"
    assert all(epoch["adds_up"] for epoch in chain["epochs"])


DATA_NODE_CHEAT_FILE = """
[run]
iterations = 4
microbatches_per_iteration = 2
seed = 3
[swarm]
relays_per_stage = 1
data_nodes = 2
cheaters = {"data-1" = "MODE"}
[chain]
epochs = 1
audit_sample = 0
"""
#: What the audit of a data node's cheat finds, and whether the chain slashes it.
DATA_NODE_CHEATS = {
    "forge-countersignature": ("invalid hop", True),
    "phantom-hops": ("invalid hop", True),
    "inflate-units": ("bad totals", True),
    "shift-span": ("bad span", True),
    "withhold-leaf": ("withheld", False),
}


@pytest.mark.slow  # a devnet and four OS processes per mode: ~30-60 s each
@pytest.mark.parametrize("mode", DATA_NODE_CHEATS)
def test_a_cheating_data_node_in_a_live_swarm_is_found_and_the_other_pays(
    tmp_path: Path, mode: str
) -> None:
    summary = swarm_of(tmp_path, DATA_NODE_CHEAT_FILE.replace("MODE", mode), timeout_s=300)
    audit, (kind, slashed) = summary["chain"]["audit"], DATA_NODE_CHEATS[mode]
    assert {(f["kind"], f["accused"]) for f in audit["findings"]} == {(kind, "data-1")}
    outcomes = [c["outcome"] for c in audit["challenges"]]  # (a second proof: judged before)
    assert outcomes.count("slashed") == int(slashed), outcomes
    assert set(outcomes) <= {"slashed", "already judged"}, outcomes
    earnings = summary["chain"]["earnings"]
    assert (earnings["data-1"]["stake_wei"] == "0") == slashed
    # The data nodes' certificates that stand pay the relays what they certified of theirs.
    chain = summary["chain"]
    addresses = {node["node"]: node["node_address"] for node in chain["registered_nodes"]}
    paying = ("data",) if slashed else ("data", "data-1")  # a slashed one's trees are void
    out, epochs = tmp_path / "out", len(chain["epochs"])
    certified = certified_units(out, chain["run_id"], epochs, paying)
    for name in ("relay-1-0", "relay-2-0"):
        assert earnings[name]["units"] == certified.get(addresses[name], 0), name
    assert sum(certified.values()) > 0
    assert all(epoch["adds_up"] for epoch in chain["epochs"])


def certified_units_of(out: Path, run_id: int, epoch: int, workers: list[str]) -> list[int]:
    """Units of ``workers`` in the data node's certificate of ``epoch``."""
    db = open_database(f"sqlite:///{out / 'data.sqlite'}")
    try:
        entries = HopStore(db).certified_hops(run_id, epoch)
    finally:
        db.close()
    return [e.receipt.units for e in entries if e.receipt.worker in workers]


CHAINLESS_FILE = """
[run]
iterations = 3
microbatches_per_iteration = 2
[swarm]
relays_per_stage = 1
[chain]
enabled = false
"""


@pytest.mark.slow  # three OS processes loading torch: ~1 minute on two cores
def test_swarm_without_a_chain_trains_with_admission_off(tmp_path: Path) -> None:
    summary = swarm_of(tmp_path, CHAINLESS_FILE, timeout_s=300)
    assert summary["iterations"] == 3 and summary["microbatches"] == 6
    assert summary["chain"] == {"enabled": False}
    assert not (tmp_path / "out" / "devnet.json").exists()
    settings = tomllib.loads((tmp_path / "out" / "relay-1-0.toml").read_text())
    assert settings["chain"]["admission"] is False


TWO_DATA_NODES_FILE = """
[run]
# Enough iterations that the lone data node is still training when the other comes back
# (iterations of this tiny run take ~0.1 s on a fast machine).
iterations = 40
microbatches_per_iteration = 2
[swarm]
relays_per_stage = 1
data_nodes = 2
[chain]
epochs = 2
[churn]
events = [{t = 1.0, kill = "data-1"}, {t = 1.5, restart = "data-1"}]
"""


@pytest.mark.slow  # a devnet and four OS processes, one restarted: ~2 minutes on two cores
def test_two_data_node_processes_share_the_run_and_one_comes_back_after_a_sigkill(
    tmp_path: Path,
) -> None:
    """A data node killed by SIGKILL and started again with its identity: the other trains on
    alone meanwhile, takes it back in, and both end with the same state as the relays step;
    each certifies its own shard's hops (the restarted one from its database) and the relays
    claim from both."""
    summary = swarm_of(tmp_path, TWO_DATA_NODES_FILE, timeout_s=300)
    assert summary["iterations"] == 40
    assert [c["node"] for c in summary["crashes"]] == ["data-1"]
    assert summary["joins"][0]["node"] == "data-1" and summary["joins"][0]["restart"]
    data_nodes = summary["data_nodes"]
    assert sorted(data_nodes) == ["data", "data-1"]
    assert data_nodes["data"] == data_nodes["data-1"] and data_nodes["data"]["step"] == 40
    assert sorted(summary["relays"]) == ["relay-1-0", "relay-2-0"]
    assert all(relay["step"] == 40 for relay in summary["relays"].values())
    # Every microbatch the data nodes finished counts, the first life's included: all of
    # "data"'s, and some of "data-1"'s (not the ones lost with it or those before it was back).
    assert 40 * 2 < summary["microbatches"] < 40 * 2 * 2
    settings = tomllib.loads((tmp_path / "out" / "data-1.toml").read_text())
    assert settings["training"]["data_shard"] == 1 and settings["node"]["join"] is True
    epochs = summary["chain"]["epochs"]
    assert all(epoch["adds_up"] and epoch["closed"] for epoch in epochs[:2]), epochs
    data_nodes_certifying = {node for epoch in epochs for node in epoch["certificates"]}
    assert len(data_nodes_certifying) == 2, "each data node certified its own shard's hops"
