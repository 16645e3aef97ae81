"""A CPU sampler for every thread of a Python process, loaded at start-up when this folder is on
``PYTHONPATH`` and ``BENCH_CPU_SAMPLES`` names a folder (``bench/receipt_cost.py`` sets both for
the swarm's nodes).

Every ``_PERIOD_S`` it takes each thread's Python stack (``sys._current_frames``) and the CPU the
thread used since the last sample (``/proc/self/task/<tid>/schedstat``, nanoseconds), and adds
that CPU to the stack: a thread waiting on a lock or a socket costs nothing, a thread in torch or
hashlib costs what the kernel says it ran. Every ``_DUMP_S`` and at exit it writes the totals to
``<folder>/<pid>.json`` (to a temporary name, then renamed), so a node killed at the end of a run
leaves its last totals. Linux only; elsewhere it does nothing.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import threading
import time

_PERIOD_S = 0.005
_DUMP_S = 1.0
_DEPTH = 40  # frames kept of each stack, innermost first


def _cpu_ns(tid: int) -> int | None:
    try:
        with open(f"/proc/self/task/{tid}/schedstat") as file:
            return int(file.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _stack(frame: object) -> str:
    names = []
    while frame is not None and len(names) < _DEPTH:
        code = frame.f_code  # type: ignore[attr-defined]
        names.append(f"{code.co_filename}:{code.co_name}")
        frame = frame.f_back  # type: ignore[attr-defined]
    return ";".join(names)


_totals: dict[str, int] = {}


def _dump(folder: str) -> None:
    path = os.path.join(folder, f"{os.getpid()}.json")
    tmp = path + ".tmp"
    with open(tmp, "w") as file:
        sample = {"argv": " ".join(sys.argv), "process_ns": time.process_time_ns()}
        json.dump({**sample, "stacks": dict(_totals)}, file)
    os.replace(tmp, path)


def _sample(folder: str) -> None:
    me = threading.get_ident()
    last: dict[int, int] = {}
    totals = _totals
    dumped = time.monotonic()
    while True:
        time.sleep(_PERIOD_S)
        frames = sys._current_frames()
        for thread in threading.enumerate():
            if thread.ident == me or thread.native_id is None or thread.ident not in frames:
                continue
            now = _cpu_ns(thread.native_id)
            if now is None:
                continue
            used = now - last.get(thread.native_id, now)
            last[thread.native_id] = now
            if used > 0:
                key = f"{thread.name}|{_stack(frames[thread.ident])}"
                totals[key] = totals.get(key, 0) + used
        if time.monotonic() - dumped > _DUMP_S:
            dumped = time.monotonic()
            _dump(folder)


_folder = os.environ.get("BENCH_CPU_SAMPLES")
if _folder and sys.platform == "linux":
    threading.Thread(target=_sample, args=(_folder,), name="cpu-sampler", daemon=True).start()
    atexit.register(_dump, _folder)
