"""A relay's iteration state is written in the evidence archive's writer thread, off the compute
path; what an auditor or juror needs must survive that.

* A relay process killed in the middle of writing a state leaves the states kept before it
  intact and no half file under the state's name; the restarted relay keeps it again.
* A hop's output goes no further (its receipt is not signed) until the state it was computed
  with is on disk; a failed write holds the hop back, and the next hop keeps the state again.
* Every hop that does go on replays from the state kept (``test_kept_state.py`` checks the
  relay's other rules on the same path).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import trio

from gwtf.contracts.encoding import FORWARD
from gwtf.node.audit.reexecute import HopEvidence, Replayer
from gwtf.node.runtime.dataplane.hop import HopHeader
from gwtf.node.store.evidence import EvidenceArchive
from gwtf.node.training import checkpoint
from tests.runtime.test_kept_state import (
    EPOCH,
    ITERATION,
    PLAN,
    SETTINGS,
    forward,
    relay,
    stage_one,
)

ROOT = Path(__file__).resolve().parents[2]

#: A relay process that keeps a state, then dies half way through writing the next one.
_DIES_MID_WRITE = """
import sys, time
from pathlib import Path
from gwtf.node.store.evidence import EvidenceArchive

archive = EvidenceArchive(Path(sys.argv[1]), keep_epochs=2)
archive.keep_state(0, 1, lambda: lambda path: path.write_bytes(b"first state"), bool)
assert archive.state(0, 1) == b"first state"

def half_then_hang(path):
    with path.open("wb") as file:
        file.write(b"half of the second st")
        file.flush()
        Path(sys.argv[2]).touch()
        time.sleep(60)

archive.keep_state(0, 2, lambda: half_then_hang, bool)
time.sleep(60)
"""


def test_a_relay_killed_mid_write_keeps_its_earlier_state_and_no_half_file(tmp_path: Path) -> None:
    root, writing = tmp_path / "evidence", tmp_path / "writing"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    child = subprocess.Popen(
        [sys.executable, "-c", _DIES_MID_WRITE, str(root), str(writing)], env=env
    )
    try:
        deadline = time.monotonic() + 30
        while not writing.exists():
            assert child.poll() is None, "the relay process died before its second write"
            assert time.monotonic() < deadline, "the relay process never began its second write"
            time.sleep(0.02)
        child.send_signal(signal.SIGKILL)
    finally:
        child.kill()
        child.wait()
    restarted = EvidenceArchive(root, keep_epochs=2)
    assert restarted.state(0, 1) == b"first state"
    assert restarted.state(0, 2) is None, "a half written state is served"
    assert restarted.keep_state(0, 2, lambda: lambda path: path.write_bytes(b"second"), bool)
    assert restarted.state(0, 2) == b"second"


def test_a_hop_goes_on_only_once_its_state_is_on_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The state is being written (held here until ``release``) while the hop is computed: the
    hop waits for it, and then replays from it."""
    release = threading.Event()
    save_file = checkpoint.save_file

    def held_save(*args: object, **kwargs: object) -> None:
        assert release.wait(30)
        save_file(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(checkpoint, "save_file", held_save)
    archive = EvidenceArchive(tmp_path, keep_epochs=2)
    role = relay(stage_one(seed=5), archive)
    hop = forward(role, microbatch=0)
    assert hop is not None
    state_file = tmp_path / str(EPOCH) / f"state-{ITERATION}.safetensors"

    async def send() -> None:
        results: list[bool] = []

        async def sending() -> None:
            results.append(await role._state_kept(hop_header(hop[0].microbatchId)))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(sending)
            await trio.sleep(0.3)
            assert results == [] and not state_file.exists(), "a hop went on before its state"
            release.set()
        assert results == [True]

    trio.run(send)
    assert state_file.exists()
    receipt, frame, out_frame = hop
    state = archive.state(EPOCH, ITERATION)
    assert state is not None
    assert Replayer(PLAN, SETTINGS).replay(HopEvidence(receipt, frame, out_frame, state)).exact


def test_a_failed_write_holds_the_hop_back_and_the_next_hop_keeps_the_state_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    save_file = checkpoint.save_file

    def full_disk(*args: object, **kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(checkpoint, "save_file", full_disk)
    archive = EvidenceArchive(tmp_path, keep_epochs=2)
    role = relay(stage_one(seed=5), archive)
    first = forward(role, microbatch=0)
    assert first is not None
    assert not trio.run(role._state_kept, hop_header(0)), "a hop went on without its state"
    assert archive.state(EPOCH, ITERATION) is None
    left = [p.name for p in (tmp_path / str(EPOCH)).iterdir() if "state" in p.name]
    assert left == [], "a failed write left a file behind"

    monkeypatch.setattr(checkpoint, "save_file", save_file)
    second = forward(role, microbatch=1)
    assert second is not None
    assert trio.run(role._state_kept, hop_header(1))
    receipt, frame, out_frame = second
    state = archive.state(EPOCH, ITERATION)
    assert state is not None
    assert Replayer(PLAN, SETTINGS).replay(HopEvidence(receipt, frame, out_frame, state)).exact


def hop_header(microbatch: int) -> HopHeader:
    """The header ``forward`` gives its hop of ``microbatch``."""
    return HopHeader(
        run_id=1, iteration=ITERATION, microbatch_id=microbatch, attempt=0, direction=FORWARD,
        stage=1, slot=0, flags=0, origin="data", path=("data",), epoch=EPOCH,
    )  # fmt: skip
