"""How a node process logs: one line per record, each naming its node, and the networking
libraries' noise summarised.

py-libp2p logs every failed dial and stream of a peer that died, some as blocks of many lines,
at WARNING and ERROR: a swarm with a kill prints hundreds of them. They are counted instead,
and every ``DIGEST_PERIOD_S`` one line says how many there were and which was most frequent (its
first line, peer ids and numbers masked). ``GWTF_LOG_LEVEL=debug`` shows every one of them.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import time
from collections import Counter
from collections.abc import Callable

#: Loggers of the networking libraries, summarised rather than shown.
NOISY = ("libp2p", "multiaddr", "async_service")
DIGEST_PERIOD_S = 30.0
_PEER_OR_NUMBER = re.compile(r"\b(?:16Uiu2|12D3Koo|Qm)\w+|\d+")


class LibraryDigest(logging.Filter):
    """Holds back the noisy libraries' records (below CRITICAL), counting them by their first
    line; the first record after each period passes as a summary of the period."""

    def __init__(
        self, period_s: float = DIGEST_PERIOD_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        super().__init__()
        self.period_s, self.clock = period_s, clock
        self.counts: Counter[str] = Counter()
        self.since = clock()

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.name.startswith(NOISY) or record.levelno >= logging.CRITICAL:
            return True
        try:
            return self._count(record)
        except Exception:  # a library's malformed record: shown as it is, never raised into it
            return True

    def _count(self, record: logging.LogRecord) -> bool:
        lines = record.getMessage().strip().splitlines() or [""]
        self.counts[_PEER_OR_NUMBER.sub("#", lines[0])[:160]] += 1
        now = self.clock()
        if now - self.since < self.period_s:
            return False
        (common, times), total = self.counts.most_common(1)[0], sum(self.counts.values())
        record.name, record.levelno, record.levelname = "libp2p", logging.WARNING, "WARNING"
        record.msg = "%s warnings from the networking library in %.0f s, most often (%sx): %s"
        record.args = (total, now - self.since, times, common)
        record.exc_info = record.exc_text = record.stack_info = None
        self.counts.clear()
        self.since = now
        return True


def configure_logging(node_name: str | None = None) -> None:
    """Log to stderr at ``GWTF_LOG_LEVEL`` (info by default), each line naming ``node_name``;
    the networking libraries' records summarised unless the level is debug."""
    level = getattr(logging, os.environ.get("GWTF_LOG_LEVEL", "info").upper(), logging.INFO)
    named = f" {node_name}" if node_name else ""
    logging.basicConfig(
        level=level,
        format=f"%(asctime)s{named} %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    for noisy in NOISY:
        library = logging.getLogger(noisy)
        # py-libp2p stops its records at its own logger, which has no handler: Python's last
        # resort printed them bare, without time or node.
        library.propagate = True
        library.setLevel(level if level <= logging.DEBUG else logging.WARNING)
    if level > logging.DEBUG:
        digest = LibraryDigest()
        for handler in logging.getLogger().handlers:
            handler.addFilter(digest)
