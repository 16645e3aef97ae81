"""An emulated internet on one Linux machine: network namespaces as hosts, iptables as routers.

A *core* namespace routes between every attached host. A *public* host hangs off the core
with an address anyone can dial. A *home* sits behind a router namespace: the router's WAN side
hangs off the core like a public host, its LAN side holds the home, and it masquerades the home
behind its WAN address, as a household router does:

* ``nat="cone"``: plain ``MASQUERADE``, a port-restricted cone that keeps the home's source port
  when it is free (the same mapping whatever the destination);
* ``nat="symmetric"``: ``MASQUERADE --random-fully``, a new random port per destination;
* ``inbound="drop"``: a connection from outside that the home did not open is dropped (the
  dialer waits out its own timeout); ``inbound="rst"``: it is answered with a TCP reset.

Addresses come only from 198.18.0.0/15 (reserved for benchmarking, never routed on the
internet): attachment ``k`` is 198.18.k.0/24 (core .1, host or router .2), home ``k``'s LAN is
198.19.k.0/24 (router .1, home .2). The core has no route to any LAN, so a home's own address
is unreachable from outside, as on the internet.

Every namespace is named ``gwtfbed-<pid>-<random>-<role>``; building and tearing down are one
context manager whose exit kills the processes it started and deletes every namespace (their
veths and iptables rules go with them) however the test ends. ``atexit`` does the same for a
process that leaves without unwinding, and each new bed first removes beds of processes that
no longer exist.

Hosts carry a region name of ``gwtf/coordinator_free/sim/data/regions-10.json``; the kernel adds no
delay (this machine's kernel has no ``sch_netem``): nodes emulate the regions' latency
themselves (``p2p.topology_file``, ``gwtf/node/p2p/link_emulation.py``).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import secrets
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Literal

PREFIX = "gwtfbed-"
TOOLS = ("ip", "iptables", "conntrack")
#: Each command of the build is local and quick; one that hangs is a broken machine.
COMMAND_TIMEOUT_S = 10.0
Nat = Literal["cone", "symmetric"]
Inbound = Literal["drop", "rst"]


@dataclass(frozen=True)
class Router:
    namespace: str
    wan_ip: str
    lan_ip: str
    nat: Nat
    inbound: Inbound


@dataclass(frozen=True)
class Host:
    name: str
    namespace: str
    region: str
    #: The host's own address (a home's is on its LAN, unreachable from outside).
    ip: str
    #: Its router, for a home; None for a public host.
    router: Router | None = None

    @property
    def public_ip(self) -> str:
        """The address the internet sees it at: its router's WAN address, for a home."""
        return self.router.wan_ip if self.router else self.ip


@dataclass(frozen=True)
class HomeSpec:
    name: str
    region: str
    nat: Nat = "cone"
    inbound: Inbound = "drop"


@dataclass
class Bed:
    prefix: str
    hosts: dict[str, Host] = field(default_factory=dict)
    namespaces: list[str] = field(default_factory=list)
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def run(
        self, host: Host | str, argv: Sequence[str], timeout_s: float = COMMAND_TIMEOUT_S
    ) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` inside ``host``'s namespace and wait for it."""
        return subprocess.run(
            ["ip", "netns", "exec", self._namespace(host), *argv],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )

    def popen(self, host: Host | str, argv: Sequence[str]) -> subprocess.Popen[bytes]:
        """Start ``argv`` inside ``host``'s namespace; the bed kills it when it is torn down."""
        process = subprocess.Popen(
            ["ip", "netns", "exec", self._namespace(host), *argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        self.processes.append(process)
        return process

    def reboot_router(self, home: Host | str) -> None:
        """Forget every mapping the home's router holds, as a router that restarts does."""
        router = self._host(home).router
        if router is None:
            raise ValueError(f"{home} is a public host: it has no router")
        _run(["ip", "netns", "exec", router.namespace, "conntrack", "-F"])

    def refused_dials(self, home: Host | str) -> int:
        """Packets the home's router dropped or reset at its own address: dials from outside
        (each SYN of a dial that waits out its deadline counts)."""
        listed = _run(["ip", "netns", "exec", self._router(home).namespace,
                       "iptables", "-L", "INPUT", "-v", "-n", "-x"])  # fmt: skip
        rows = [line.split() for line in listed.splitlines()[2:]]
        return sum(int(row[0]) for row in rows if len(row) > 2 and row[2] in ("DROP", "REJECT"))

    def forward_port(self, home: Host | str, port: int) -> None:
        """Open ``port`` on the home's router to the home (a port forward set by its owner)."""
        host = self._host(home)
        router = self._router(home)
        target = f"{host.ip}:{port}"
        _run(["ip", "netns", "exec", router.namespace, "iptables", "-t", "nat", "-A",
              "PREROUTING", "-i", "wan", "-p", "tcp", "--dport", str(port), "-j", "DNAT",
              "--to-destination", target])  # fmt: skip
        _run(["ip", "netns", "exec", router.namespace, "iptables", "-A", "FORWARD", "-i", "wan",
              "-o", "lan", "-p", "tcp", "-d", host.ip, "--dport", str(port),
              "-j", "ACCEPT"])  # fmt: skip

    def cut_link(self, home: Host | str, reset: bool = False) -> None:
        """The home's router passes nothing any more, either way: silently (its uplink is
        down), or with ``reset`` answering each TCP packet with a reset (it tears down the
        home's connections and refuses its dials)."""
        refuse = ["-p", "tcp", "-j", "REJECT", "--reject-with", "tcp-reset"] if reset else [
            "-j", "DROP"]  # fmt: skip
        _run(["ip", "netns", "exec", self._router(home).namespace,
              "iptables", "-I", "FORWARD", "1", *refuse])  # fmt: skip

    def restore_link(self, home: Host | str) -> None:
        """Undo ``cut_link``."""
        _run(["ip", "netns", "exec", self._router(home).namespace,
              "iptables", "-D", "FORWARD", "1"])  # fmt: skip

    def _router(self, home: Host | str) -> Router:
        router = self._host(home).router
        if router is None:
            raise ValueError(f"{home} is a public host: it has no router")
        return router

    def close(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.kill()
        for process in self.processes:
            # A process stuck in the kernel: deleting its namespace still proceeds.
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=COMMAND_TIMEOUT_S)
            for stream in (process.stdout, process.stderr):
                if stream is not None:
                    stream.close()
        remove_namespaces(self.prefix)

    def _host(self, host: Host | str) -> Host:
        return self.hosts[host] if isinstance(host, str) else host

    def _namespace(self, host: Host | str) -> str:
        return self._host(host).namespace


def missing_requirements() -> str | None:
    """Why this machine cannot build a bed, in one line, or None."""
    if os.geteuid() != 0:
        return "the internet test bed needs root (network namespaces and iptables)"
    absent = [tool for tool in TOOLS if shutil.which(tool) is None]
    if absent:
        return (
            f"the internet test bed needs {', '.join(absent)}: "
            "apt-get install iproute2 iptables conntrack"
        )
    probe = f"{PREFIX}{os.getpid()}-probe"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"cannot create a network namespace here: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


@contextmanager
def build_bed(public: dict[str, str], homes: Sequence[HomeSpec] = ()) -> Iterator[Bed]:
    """A bed with public hosts (name -> region) and ``homes``, torn down on exit."""
    remove_stale_beds()
    own = f"{PREFIX}{os.getpid()}-"
    # One hook for every bed of this process: the namespaces share the process's prefix.
    atexit.unregister(remove_namespaces)
    atexit.register(remove_namespaces, own)
    bed = Bed(f"{own}{secrets.token_hex(3)}-")
    try:
        _build(bed, public, homes)
        yield bed
    finally:
        bed.close()


def namespaces() -> list[str]:
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False)
    return [line.split()[0] for line in listed.stdout.splitlines() if line.strip()]


def remove_namespaces(prefix: str) -> None:
    """Delete every namespace whose name starts with ``prefix`` (veths and rules go with it)."""
    for name in namespaces():
        if name.startswith(prefix):
            subprocess.run(["ip", "netns", "del", name], capture_output=True, check=False)


def remove_stale_beds() -> None:
    """Delete beds left by processes that died without tearing them down (SIGKILL)."""
    for name in namespaces():
        match = re.match(rf"{PREFIX}(\d+)-", name)
        if match and not _alive(int(match.group(1))):
            subprocess.run(["ip", "netns", "del", name], capture_output=True, check=False)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _build(bed: Bed, public: dict[str, str], homes: Sequence[HomeSpec]) -> None:
    core = _add_namespace(bed, "core")
    _forwarding(core)
    attachment = 0
    for name, region in public.items():
        namespace = _add_namespace(bed, f"pub-{name}")
        ip = _attach(core, namespace, attachment)
        bed.hosts[name] = Host(name, namespace, region, ip)
        attachment += 1
    for index, home in enumerate(homes):
        router_ns = _add_namespace(bed, f"rt-{home.name}")
        home_ns = _add_namespace(bed, f"home-{home.name}")
        wan_ip = _attach(core, router_ns, attachment)
        attachment += 1
        lan_ip, home_ip = f"198.19.{index}.1", f"198.19.{index}.2"
        _run(["ip", "-n", router_ns, "link", "add", "lan", "type", "veth", "peer", "name",
              "eth0", "netns", home_ns])  # fmt: skip
        _up(router_ns, "lan", f"{lan_ip}/24")
        _up(home_ns, "eth0", f"{home_ip}/24")
        _run(["ip", "-n", home_ns, "route", "add", "default", "via", lan_ip])
        _forwarding(router_ns)
        router = Router(router_ns, wan_ip, lan_ip, home.nat, home.inbound)
        _router_rules(router)
        bed.hosts[home.name] = Host(home.name, home_ns, home.region, home_ip, router)


def _router_rules(router: Router) -> None:
    def iptables(*rule: str) -> None:
        _run(["ip", "netns", "exec", router.namespace, "iptables", *rule])

    masquerade = ["-j", "MASQUERADE"] + (["--random-fully"] if router.nat == "symmetric" else [])
    iptables("-t", "nat", "-A", "POSTROUTING", "-o", "wan", *masquerade)
    # Nothing from outside reaches the LAN unless it answers what the home opened.
    iptables("-P", "FORWARD", "DROP")
    iptables("-A", "FORWARD", "-i", "lan", "-o", "wan", "-j", "ACCEPT")
    iptables("-A", "FORWARD", "-i", "wan", "-m", "conntrack", "--ctstate",
             "ESTABLISHED,RELATED", "-j", "ACCEPT")  # fmt: skip
    # A dial at the router's own address: silence, or a reset (what TCP hole punching meets).
    refuse = ["-j", "DROP"] if router.inbound == "drop" else [
        "-j", "REJECT", "--reject-with", "tcp-reset"]  # fmt: skip
    iptables("-A", "INPUT", "-i", "wan", "-p", "tcp", "-m", "conntrack", "--ctstate", "NEW",
             *refuse)  # fmt: skip


def _add_namespace(bed: Bed, role: str) -> str:
    name = f"{bed.prefix}{role}"
    _run(["ip", "netns", "add", name])
    bed.namespaces.append(name)
    _run(["ip", "-n", name, "link", "set", "lo", "up"])
    return name


def _attach(core: str, namespace: str, index: int) -> str:
    """Link ``namespace`` to the core on 198.18.index.0/24; its address there."""
    if not 0 <= index <= 255:
        raise ValueError(f"a bed holds at most 256 attachments, not {index + 1}")
    _run(["ip", "-n", core, "link", "add", f"c{index}", "type", "veth", "peer", "name", "wan",
          "netns", namespace])  # fmt: skip
    _up(core, f"c{index}", f"198.18.{index}.1/24")
    _up(namespace, "wan", f"198.18.{index}.2/24")
    _run(["ip", "-n", namespace, "route", "add", "default", "via", f"198.18.{index}.1"])
    return f"198.18.{index}.2"


def _up(namespace: str, device: str, address: str) -> None:
    _run(["ip", "-n", namespace, "addr", "add", address, "dev", device])
    _run(["ip", "-n", namespace, "link", "set", device, "up"])


def _forwarding(namespace: str) -> None:
    _run(["ip", "netns", "exec", namespace, "sysctl", "-qw", "net.ipv4.ip_forward=1"])


def _run(argv: list[str]) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed: {done.stderr.strip()}")
    return done.stdout
