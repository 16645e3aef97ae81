"""The internet test bed itself: homes reach out, nobody dials in, each router maps as its kind
does, and nothing is left behind; then two real libp2p hosts talk across a home router."""

from __future__ import annotations

import queue
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest

from tests.internet.conftest import HOMES, PUBLIC, require_testbed
from tests.internet.testbed import Bed, HomeSpec, build_bed, namespaces

PORT = 7000
PROBE = [sys.executable, "-m", "tests.internet.probe"]


class Lines:
    """A process's stdout, line by line, with a deadline on each wait."""

    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        self.process = process
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line.decode())

    def wait_for(self, prefix: str, timeout_s: float = 20.0) -> str:
        while True:
            try:
                line = self.lines.get(timeout=timeout_s)
            except queue.Empty:
                err = self.process.stderr
                ended = self.process.poll() is not None and err is not None
                stderr = err.read().decode() if ended and err is not None else ""
                raise AssertionError(f"no line {prefix!r} within {timeout_s} s: {stderr}") from None
            if line.startswith(prefix):
                return line.strip()


@pytest.fixture(scope="module")
def serving(bed: Bed) -> Iterator[Bed]:
    """A probe server on every host, public and home alike, on the same port."""
    for host in bed.hosts:
        Lines(bed.popen(host, [*PROBE, "serve", str(PORT)])).wait_for("listening")
    yield bed


def dial(bed: Bed, source: str, ip: str, source_port: int = 0, timeout_s: float = 1.0) -> str:
    argv = [*PROBE, "dial", ip, str(PORT), "--timeout", str(timeout_s)]
    done = bed.run(source, [*argv, "--source-port", str(source_port)])
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.mark.parametrize("home", [h.name for h in HOMES])
def test_a_home_reaches_a_public_host_as_its_router(serving: Bed, home: str) -> None:
    router = serving.hosts[home].router
    assert router is not None
    for public in PUBLIC:
        seen = dial(serving, home, serving.hosts[public].ip)
        assert seen.startswith(f"seen {router.wan_ip} "), seen


@pytest.mark.parametrize("home", HOMES, ids=[h.name for h in HOMES])
def test_nobody_outside_dials_into_a_home(serving: Bed, home: HomeSpec) -> None:
    host = serving.hosts[home.name]
    assert host.router is not None
    expected = "timeout" if home.inbound == "drop" else "refused"
    # At the router (which forwards nothing), and at the home's own address (routed nowhere).
    assert dial(serving, "tokyo", host.router.wan_ip) == expected
    assert dial(serving, "tokyo", host.ip) in ("timeout", "unreachable")
    # Though the home listens: from inside, its own address answers.
    assert dial(serving, home.name, host.ip).startswith(f"seen {host.ip} ")


def test_a_cone_router_keeps_the_homes_port_and_a_symmetric_one_picks_new_ones(
    serving: Bed,
) -> None:
    cone = [dial(serving, "cone-drop", serving.hosts[p].ip, source_port=40001) for p in PUBLIC]
    wan = serving.hosts["cone-drop"].public_ip
    assert cone == [f"seen {wan} 40001"] * len(PUBLIC)
    symmetric = [
        dial(serving, "symmetric-rst", serving.hosts[p].ip, source_port=40002) for p in PUBLIC
    ]
    ports = {line.split()[-1] for line in symmetric}
    assert ports != {"40002"} and len(ports) > 1, symmetric


def test_a_rebooted_router_maps_the_home_again(serving: Bed) -> None:
    serving.reboot_router("cone-rst")
    wan = serving.hosts["cone-rst"].public_ip
    assert dial(serving, "cone-rst", serving.hosts["tokyo"].ip, 40003) == f"seen {wan} 40003"


def test_a_bed_leaves_no_namespace_behind_even_when_its_test_fails() -> None:
    require_testbed()
    with (
        pytest.raises(RuntimeError, match="the test failed"),
        build_bed({"a": "oregon"}, [HomeSpec("h", "tokyo")]) as bed,
    ):
        sleeper = bed.popen("h", ["sleep", "60"])
        assert set(bed.namespaces) <= set(namespaces()) and len(bed.namespaces) == 4
        raise RuntimeError("the test failed")
    assert not [name for name in namespaces() if name.startswith(bed.prefix)]
    assert sleeper.poll() is not None, "the bed's processes are killed"


def test_a_public_libp2p_host_answers_a_home_over_the_connection_the_home_opened(
    bed: Bed,
) -> None:
    peer = [sys.executable, "-m", "tests.internet.p2p_peer"]
    public = Lines(bed.popen("frankfurt", [*peer, "public"]))
    address = public.wait_for("address ").split()[1]
    assert address.startswith(f"/ip4/{bed.hosts['frankfurt'].ip}/tcp/4001/p2p/")
    home = Lines(bed.popen("cone-drop", [*peer, "home", address]))
    assert home.wait_for("hello ") == "hello welcome"
    answered = public.wait_for("answered ")
    assert answered.startswith("answered pong over ")
    assert f"/ip4/{bed.hosts['cone-drop'].public_ip}/tcp/" in answered, answered


def test_without_root_the_bed_fails_in_ci_and_is_skipped_elsewhere(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("tests.internet.testbed.os.geteuid", lambda: 1000)
    monkeypatch.setenv("CI", "1")
    with pytest.raises(pytest.fail.Exception, match=r"CI must run the internet test bed: .*root"):
        require_testbed()
    monkeypatch.delenv("CI")
    with pytest.raises(pytest.skip.Exception, match="needs root"):
        require_testbed()
