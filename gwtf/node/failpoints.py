"""Named points where a test can have this process die by SIGKILL, to prove what a crash there
leaves behind: ``GWTF_FAILPOINT=name`` in the environment arms one point, and the process kills
itself the first time it passes it (``name:n``: the n-th time). Unarmed (always, outside tests) a
point costs a comparison.

The points: ``store.mid_batch`` (inside a receipt batch's transaction, after its first table),
``epochs.after_submit`` (a certificate mined, not yet recorded), ``epochs.after_claim`` (a
reward claimed, not yet recorded).
"""

from __future__ import annotations

import logging
import os
import signal

log = logging.getLogger(__name__)

ENV = "GWTF_FAILPOINT"
_ARMED, _, _NTH = os.environ.get(ENV, "").partition(":")
_passes = [int(_NTH) if _NTH.isdigit() else 1]


def failpoint(name: str) -> None:
    """Die here by SIGKILL if ``name`` is the armed point (at its armed pass)."""
    if _ARMED and name == _ARMED:
        _passes[0] -= 1
        if _passes[0] > 0:
            return
        log.warning("failpoint %s: dying by SIGKILL", name)
        for handler in logging.getLogger().handlers:
            handler.flush()
        os.kill(os.getpid(), signal.SIGKILL)
