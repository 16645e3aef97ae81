"""One live node as an OS process: ``python -m gwtf.node.process --config node.toml``.

The node is configured by its settings file (``gwtf.node.settings``: sections ``node``, ``p2p``,
``chain``, ``training``, ``flow``; flags > ``GWTF_*`` env > file > defaults), which the
composition root (``gwtf.node.composition``) turns into the live node. With ``chain.admission =
true`` the node serves only peers that the chain (``chain.rpc_url`` or the devnet file's, contracts
from ``chain.devnet_file``) binds to a staked node of ``chain.run_id``.

Flags of the process supervisor (``gwtf-node swarm``), not settings of the node:
``--status-file`` (the node writes its PID, its listen address once started, hop statistics, its
part's step and state digest (taken once a step in its compute thread, null until then) and
refused peers every 0.25 s — always by atomic rename, so a reader, or a ``kill -9`` mid-write,
never sees a torn file; a data node adds its latest iteration's result, and appends every result
as a JSON line to ``results_file_of(status file)``, so the status stays small however long the
run); ``--start-file`` (with
its host up and its worker built, wait until that path exists before making itself known: a
joiner started ahead of time, waiting for its moment); ``--pace-file`` (a data node starts
iteration i only once that file holds a count above i: the supervisor holds it between
iterations, after the one in flight); and
``--crash-on JSON`` ({"direction": "forward"|"backward", "iteration": int, "lock": path}, given
once per rule): fault injection for tests — the first node to reach such a hop and create
``lock`` kills itself with SIGKILL right there, mid-hop, so a crash lands exactly where a test
wants it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import trio

from gwtf.errors import GwtfError
from gwtf.node.composition import live_config_from_settings, local_api_from_settings
from gwtf.node.local_api.service import LocalApi, run_local_api
from gwtf.node.local_api.snapshot import SnapshotBox
from gwtf.node.logs import configure_logging
from gwtf.node.runtime.dataplane.compute import in_worker_thread
from gwtf.node.runtime.fault_injection import arm_crash
from gwtf.node.runtime.live_node import (
    EntryGate,
    IterationGate,
    LiveNode,
    LiveNodeConfig,
    run_live_node,
)
from gwtf.node.runtime.roles.data import DataRole
from gwtf.node.settings import load_settings
from gwtf.node.status_file import ResultsLog, results_file_of, write_status
from gwtf.node.training.checkpoint import DigestAtStep

log = logging.getLogger(__name__)


def node_status(node: LiveNode, digest: DigestAtStep) -> dict[str, Any]:
    """The node's status; its ``state_digest`` is ``digest``'s of the state at ``step`` (None
    while that one is being computed): reading it touches no tensor."""
    role = node.role
    status: dict[str, Any] = {
        "name": node.config.name,
        "pid": os.getpid(),
        "peer_id": node.plane.node_id,
        "address": node.address,
        # Every address it advertises, the one above first.
        "addresses": list(node.book.own.addresses),
        "role": node.config.role,
        "stage": node.config.stage,
        "stats": dataclasses.asdict(role.stats),
        "hops_recorded": node.plane.hops.recorded,
        "recomputed_hops": node.plane.hops.recomputed,
        # Circuits upgraded to direct connections, and punches that failed (``holepunch``).
        "holes_punched": node.punch.punched if node.punch is not None else 0,
        "punch_failures": node.punch.failures if node.punch is not None else 0,
        # Peers a punch connected directly, and those still connected so.
        "punched_peers": node.punch.punched_peers() if node.punch is not None else [],
        "direct_peers": node.punch.direct_peers() if node.punch is not None else [],
        # What this node relayed for each peer (bytes from and to it, seconds its reads waited
        # over its rate, circuits it has open; ``relay_metering``); empty when it relays not.
        "relayed": node.relay.hop.meter.view() if node.relay and node.relay.hop else {},
        # Peers this node refused (banned, or not admitted to the run), with how often.
        "refused": dict(node.rpc.refused),
        # Where this node's hop time goes, and its CPU seconds (the throughput benchmark's).
        "hop_timings": dataclasses.asdict(node.plane.timings),
        "cpu_s": sum(os.times()[:2]),
    }
    if isinstance(role, DataRole):
        status["iterations_done"] = len(role.results)
        status["last_result"] = dataclasses.asdict(role.results[-1]) if role.results else None
        status["training"] = role.training
        status["finished"] = role.finished
    if node.receipts is not None:
        parts = node.receipts
        status["receipts"] = {
            **dataclasses.asdict(parts.book.counts),
            "address": parts.book.address,
            "epoch": parts.clock.epoch_now(),
            "reported": parts.reporter.reported if parts.reporter else 0,
            "unreported": parts.reporter.pending if parts.reporter else 0,
            "accepted": parts.inbox.accepted if parts.inbox else 0,
            "refused_reports": parts.inbox.refused if parts.inbox else 0,
            "cycle": dataclasses.asdict(parts.cycle.status),
        }
    status["step"] = role.worker.step_count
    status["state_digest"] = digest.current()
    return status


class StatusDigest:
    """Keeps the status's state digest current: whenever the part's state moved (a step, a
    loaded state), digests it once in the node's compute thread, after the work queued there
    (never while a step changes the weights, never on the event loop)."""

    def __init__(self, node: LiveNode) -> None:
        self.node = node
        self.digest = DigestAtStep(node.role.worker)
        self._refreshing = False

    def start_refresh(self, nursery: trio.Nursery) -> None:
        """Digest the present state in the background, unless that is done or under way."""
        if not self._refreshing and self.digest.current() is None:
            self._refreshing = True
            nursery.start_soon(self.refresh)

    async def refresh(self) -> None:
        try:
            await in_worker_thread(self.node.role.limiter, self.digest.refresh)
        finally:
            self._refreshing = False


async def run_process(
    config: LiveNodeConfig,
    status_file: Path,
    crash_on: Sequence[dict[str, Any]] = (),
    api: LocalApi | None = None,
) -> None:
    started: list[tuple[LiveNode, StatusDigest]] = []
    extra = {"api_url": api.url} if api is not None else {}

    results = ResultsLog(results_file_of(status_file))

    def write(**finished: bool) -> None:
        node, digests = started[0]
        if isinstance(node.role, DataRole):
            results.append(node.role.results)  # before the status that counts them
        write_status(status_file, {**node_status(node, digests.digest), **extra, **finished})

    async def report() -> None:
        while True:
            if started:
                started[0][1].start_refresh(nursery)
                write()
            await trio.sleep(0.25)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(report)

        def on_started(node: LiveNode) -> None:
            started.append((node, StatusDigest(node)))
            for rule in crash_on:
                arm_crash(node, rule)
            if api is not None:
                nursery.start_soon(run_local_api, node, api, SnapshotBox())

        await run_live_node(config, on_started)
        await started[0][1].refresh()  # the final status carries the final state's digest
        write(finished=True)
        nursery.cancel_scope.cancel()


def start_file_gate(start_file: Path) -> EntryGate:
    async def wait_for_start_file() -> None:
        while not start_file.exists():
            await trio.sleep(0.05)

    return wait_for_start_file


def pace_file_gate(pace_file: Path) -> IterationGate:
    """A data node starts iteration i once ``pace_file`` holds a count above i (no file: no
    limit; the supervisor replaces it whole, so a reader never sees half a number)."""

    async def wait_for_pace(iteration: int) -> None:
        while True:
            try:
                allowed = int(pace_file.read_text())
            except FileNotFoundError:
                return
            except (OSError, ValueError):
                allowed = iteration  # being replaced: read it again
            if iteration < allowed:
                return
            await trio.sleep(0.05)

    return wait_for_pace


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m gwtf.node.process")
    parser.add_argument("--config", required=True, help="the node's settings file (TOML)")
    parser.add_argument("--status-file", required=True, help="where to write the node's status")
    parser.add_argument("--start-file", help="wait until this path exists before starting")
    parser.add_argument(
        "--pace-file", help="a data node: start iteration i once this file holds a count above i"
    )
    parser.add_argument(
        "--crash-on", action="append", default=[], help="fault injection (JSON), for tests"
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    name = Path(args.config).name.removesuffix(".toml")
    torch.set_num_threads(1)
    try:
        settings = load_settings(config_file=args.config)
        configure_logging(name, settings.log.level, json=settings.log.json)
        config = live_config_from_settings(settings)
        if args.start_file:  # a joiner: host up and worker built, it waits for its moment
            config = dataclasses.replace(config, entry_gate=start_file_gate(Path(args.start_file)))
        if args.pace_file:  # a supervisor holds it between iterations
            gate = pace_file_gate(Path(args.pace_file))
            config = dataclasses.replace(config, iteration_gate=gate)
        crash_on = [json.loads(rule) for rule in args.crash_on]
        api = local_api_from_settings(settings)
        trio.run(run_process, config, Path(args.status_file), crash_on, api)
    except (GwtfError, OSError, ValueError, KeyError, TypeError, IndexError) as exc:
        print(f"gwtf-node: error: {exc}", file=sys.stderr)
        return exc.exit_code if isinstance(exc, GwtfError) else 2
    except BaseExceptionGroup as group:
        # A GwtfError raised inside the host's nursery (a part that does not fit its memory)
        # arrives wrapped in a group: said in one line like any other.
        found, rest = group.split(GwtfError)
        if found is None or rest is not None:
            raise
        first = _first_leaf(found)
        print(f"gwtf-node: error: {first}", file=sys.stderr)
        return first.exit_code if isinstance(first, GwtfError) else 2
    except KeyboardInterrupt:
        return 130
    return 0


def _first_leaf(group: BaseExceptionGroup) -> BaseException:
    first = group.exceptions[0]
    return _first_leaf(first) if isinstance(first, BaseExceptionGroup) else first


if __name__ == "__main__":
    sys.exit(main())
