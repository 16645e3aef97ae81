"""Re-execution end to end on the test chain over JSON-RPC: two stage-1 relays' real libp2p hosts
serve the evidence of real stage computations (frames and the stage's state), the data node its
certificate. ``gwtf-node audit --sample`` re-executes the hops the block hash after the
submission deadline picks (before it exists it says so and samples nothing), finds the relay
whose output is 0.1 % off and no one else; ``gwtf-node challenge`` opens one tensor dispute with
the bond and the first jury's fees; ``gwtf-node jury serve`` reveals its draw salt; seven juror
wallets' passes (``gwtf.node.audit.jury``) draw the juries, re-execute each disputed hop from the
relays' evidence, commit, reveal and execute the rulings: the cheater is slashed, and a dispute
about an honest hop is ruled right, its bond paid to the honest worker's wallet. The sponsor
rules on nothing."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
import torch
import trio

from gwtf.contracts import fraud_proofs
from gwtf.contracts.certificate_tree import SignedReceipt
from gwtf.node.audit import jury as court_jury
from gwtf.node.audit.reexecute import Replayer
from gwtf.node.chain.actions import open_contracts
from gwtf.node.chain.adapter import Sender
from gwtf.node.cli.audit import EXIT_FINDINGS
from gwtf.node.cli.main import main
from gwtf.node.receipts.cheats import WRONG_TENSOR_SCALE
from gwtf.node.settings import load_settings
from gwtf.node.store.evidence import EvidenceArchive
from gwtf.node.training import codec
from gwtf.node.training.checkpoint import holds_state_of, snapshot_part_state
from gwtf.node.training.codec import CodecLimits
from gwtf.node.training.config import named_config
from gwtf.node.training.partition import plan_partition
from gwtf.node.training.settings import TrainingSettings
from gwtf.node.training.stage_worker import StageWorker
from tests.contracts import jury
from tests.contracts.conftest import Staffed
from tests.contracts.test_audit_command import devnet_file, serving_data_node  # noqa: F401
from tests.contracts.test_cheats_caught import challenger_wallet, run_challenge
from tests.contracts.world import ETH, NodeKey

SETTINGS = TrainingSettings(device="cpu")
LIMITS = CodecLimits()
BOND = 10**17


def computed_hops(s: Staffed, tmp_path: Path) -> tuple[list[SignedReceipt], dict[str, Any]]:
    """Stage 1 of gpt-tiny at iteration 0: a computes microbatches 0 and 1 (its output of 0 is
    off by the wrong-tensor cheat's scale), c microbatch 2; b (stage 2) received them. Each
    relay keeps what it computed and the stage's state."""
    w = s.w
    plan = plan_partition(named_config("gpt", "tiny"), 2)
    worker = StageWorker(plan, 0, SETTINGS, seed=4)
    archives = {
        key.address: EvidenceArchive(tmp_path / f"evidence-{name}", keep_epochs=2)
        for name, key in (("a", s.a), ("c", s.c))
    }
    for archive in archives.values():
        archive.keep_state(
            0,
            0,
            lambda: snapshot_part_state(worker, weights_only=True),
            lambda kept: holds_state_of(kept, worker, weights_only=True),
        )
    entries = []
    generator = torch.Generator().manual_seed(3)
    for microbatch, relay in ((0, s.a), (1, s.a), (2, s.c)):
        activation = torch.randn(2, 16, plan.config.d_model, generator=generator)
        output = worker.forward(microbatch, activation)
        worker.drop(microbatch)
        if microbatch == 0:
            output = output * (1 + WRONG_TENSOR_SCALE)
        frames = [codec.encode(microbatch, t, LIMITS) for t in (activation, output)]
        for frame in frames:
            archives[relay.address].keep_frame(0, frame)
        digests = [hashlib.sha256(frame).digest() for frame in frames]
        receipt = w.receipt(
            s.run, 0, s.data, relay, s.b, microbatch, inputDigest=digests[0],
            outputDigest=digests[1],
        )  # fmt: skip
        entries.append(w.signed(receipt, relay, s.b))
    return entries, {"archives": archives, "plan": plan}


def audit_json(
    capsys: pytest.CaptureFixture[str],
    devnet: Path,
    run: int,
    peers: list[str],
    sample: int,
    timeout: str = "10",
) -> tuple[int, dict[str, Any]]:
    argv = ["--devnet-file", str(devnet), "audit", "--run", str(run), "--epoch", "0"]
    argv += ["--sample", str(sample), "--tolerance", "cpu", "--json", "--timeout-s", timeout]
    code = main(argv + [flag for peer in peers for flag in ("--peer", peer)])
    return code, json.loads(capsys.readouterr().out)


@pytest.mark.slow  # ~35 s: a swarm trains, then an audit re-executes and a jury rules
def test_a_wrong_tensor_is_re_executed_disputed_and_ruled_and_an_honest_one_is_not(
    staffed: Staffed,
    devnet_file: Path,  # noqa: F811
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    s, w = staffed, staffed.w
    entries, made = computed_hops(s, tmp_path)
    tree = w.certificate_tree(entries)
    cert = w.certify(tree, s.run, 0, s.data)
    archives: dict[str, EvidenceArchive] = made["archives"]
    serving = [
        serving_data_node(s, s.data, tree, tmp_path / "data.sqlite"),
        serving_data_node(s, s.a, None, tmp_path / "a.sqlite", evidence=archives[s.a.address]),
        serving_data_node(s, s.c, None, tmp_path / "c.sqlite", evidence=archives[s.c.address]),
    ]
    with serving[0] as data, serving[1] as a, serving[2] as c:
        peers = [data, a, c]
        # Before the submission deadline the sample is not drawn yet.
        code, early = audit_json(capsys, devnet_file, s.run, peers, sample=3)
        assert code == 0 and "audit again after it" in early["sample_note"]
        assert early["certificates"][0]["replayed"] == []
        w.travel_to(w.epoch_times(s.run, 0)[2] + 1)
        w.mine()
        code, report = audit_json(capsys, devnet_file, s.run, peers, sample=3)
        assert code == EXIT_FINDINGS and report["sample_note"] == ""
        (certificate,) = report["certificates"]
        replayed = {r["microbatch"]: r for r in certificate["replayed"]}
        assert sorted(replayed) == [0, 1, 2]
        assert [replayed[m]["exact"] for m in (0, 1, 2)] == [False, True, True]
        assert replayed[0]["wrong"] and replayed[0]["relative_error"] == pytest.approx(
            1e-3, rel=1e-2
        )
        # Each hop re-executed with its worker's own weights (the same as its replica's).
        assert replayed[0]["weights_from"] == s.a.address.lower()
        assert replayed[2]["weights_from"] == s.c.address.lower()
        (finding,) = certificate["findings"]
        assert finding["kind"] == "wrong tensor" and finding["accused"] == s.a.address
        assert finding["fraud_proof"] == "openTensorDispute"
        # The challenge opens one dispute, with the bond.
        wallet = challenger_wallet(s, tmp_path)
        code, proven = run_challenge(
            capsys, devnet_file, wallet, s.run, peers, "--sample", "3", "--tolerance", "cpu"
        )
        assert code == 0, proven
        (disputed,) = proven["challenges"]
        assert disputed["outcome"] == "disputed" and "tensor dispute 1" in disputed["why"]
        # Someone disputes c's honest hop too.
        honest = fraud_proofs.wrong_tensor(cert, tree.leaf_proof(_index(tree, s.c)), entries[2])
        w.prove(honest)
        contracts, _ = open_contracts(
            load_settings({"chain.devnet_file": str(devnet_file)}, env={})
        )
        replayer = Replayer(made["plan"], SETTINGS)
        jurors = [Sender.unlocked(j.wallet) for j in jury.seat_jurors(w, 7)]
        jury.reveal_salt(w, 2, honest)  # the world's challenger keeps its draw salt itself
        # The auditor's serve pass reveals its draw salt (derived from its key).
        argv = ["--devnet-file", str(devnet_file), "jury", "serve", "--once", "--json"]
        argv += ["--wallet", str(wallet[0]), "--password-file", str(wallet[1])]
        assert main(argv) == 0
        steps = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
        assert {"case": 1, "action": court_jury.SALT_REVEALED} in [
            {"case": step["case"], "action": step["action"]} for step in steps
        ]

        def passes() -> list[court_jury.Step]:
            done = []
            for juror in jurors:
                done += trio.run(
                    court_jury.serve_once, contracts, juror, peers, lambda run: replayer, 10.0
                )
            return done

        # Seed blocks, then each phase's window: draw, commit, reveal, rule.
        jury.mine_to(w, max(int(jury.rounds(w, i)[0][0]) for i in (1, 2)) + 1)
        assert {st.action for st in passes()} >= {court_jury.DRAWN, court_jury.COMMITTED}
        phase = jury.phase_blocks(w)
        jury.mine_to(w, max(int(jury.rounds(w, i)[0][2]) for i in (1, 2)) + phase + 1)
        revealed = [st for st in passes() if st.action == court_jury.REVEALED]
        assert {st.detail for st in revealed if st.case_id == 1} == {"wrong tensor"}
        assert {st.detail for st in revealed if st.case_id == 2} == {"right tensor"}
        jury.mine_to(w, max(int(jury.rounds(w, i)[0][2]) for i in (1, 2)) + 3 * phase + 1)
        ruled = [st for st in passes() if st.action == court_jury.RULED_STEP]
    assert sorted(st.case_id for st in ruled) == [1, 2]
    # A wrong tensor takes the run's minimum stake (1 ETH) of a's 2 ETH; honest c keeps its 2.
    assert w.stake_of(s.a) == ETH and w.stake_of(s.c) == 2 * ETH
    # The bond of the honest hop's dispute is the honest worker's wallet's; the sponsor has
    # nothing from either ruling.
    assert w.call(w.disputes.functions.creditWei(w.wallet(2))) == BOND
    assert w.call(w.disputes.functions.creditWei(w.sponsor)) == 0
    # Nothing left to rule.
    assert court_jury.open_cases(contracts) == []


def _index(tree: Any, worker: NodeKey) -> int:
    return next(i for i, e in enumerate(tree.entries) if e.receipt.worker == worker.address)
