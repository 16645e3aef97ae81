"""Runs one command as a child that cannot outlive the process that started this one.

Usage: ``python -I tether.py COMMAND [ARG...]`` with stdin a pipe from the parent. The parent
never writes to the pipe; when it closes it, or dies in any way (SIGKILL and crashes included),
the kernel closes it and the read here returns, and the command is ended: SIGTERM, then SIGKILL
after a grace period. SIGINT and SIGTERM sent to this process are passed on the same way. The
exit status is the command's (128 + N when signal N ended it).

This is the portable way to tie a binary that never reads its stdin (anvil) to its parent:
no prctl, and a process group would not help when the parent is SIGKILLed. It runs with
``python -I`` and imports only the standard library, so it starts in tens of milliseconds.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

GRACE_S = 5.0


def end(child: subprocess.Popen[bytes]) -> None:
    """Ask the child to stop, and make it stop if it has not within the grace period."""
    if child.poll() is not None:
        return
    child.terminate()
    try:
        child.wait(timeout=GRACE_S)
    except subprocess.TimeoutExpired:
        child.kill()


def end_when_stdin_closes(child: subprocess.Popen[bytes]) -> None:
    # Whatever arrives is ignored: only the end of the stream means something.
    while sys.stdin.buffer.read(4096):
        pass
    end(child)


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: tether.py COMMAND [ARG...]", file=sys.stderr)
        return 2
    child = subprocess.Popen(argv, stdin=subprocess.DEVNULL)
    for signum in (signal.SIGINT, signal.SIGTERM):
        # The handler runs on the main thread, inside child.wait() below.
        signal.signal(signum, lambda *_: threading.Thread(target=end, args=(child,)).start())
    threading.Thread(target=end_when_stdin_closes, args=(child,), daemon=True).start()
    code = child.wait()
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    status = main(sys.argv[1:])
    # Not sys.exit: interpreter shutdown aborts while the watcher thread is blocked reading
    # stdin ("could not acquire lock for <stdin> at interpreter shutdown").
    sys.stderr.flush()
    os._exit(status)
