"""How a node process logs: one line per record at the ``[log] level`` of its settings, each
naming its node (``[log] json``: one JSON object per line), and the networking libraries' noise
summarised.

py-libp2p logs every failed dial and stream of a peer that died, some as blocks of many lines,
at WARNING and ERROR: a swarm with a kill prints hundreds of them. They are counted instead,
and every ``DIGEST_PERIOD_S`` one line says how many there were and which was most frequent (its
first line, peer ids and numbers masked). Level ``DEBUG`` (``GWTF_LOG_LEVEL=debug``, through
the settings) shows every one of them.
"""

from __future__ import annotations

import logging
import re
import sys
import time
from collections import Counter
from collections.abc import Callable
from json import dumps

#: Loggers of the networking libraries, summarised rather than shown.
NOISY = ("libp2p", "multiaddr", "async_service")
DIGEST_PERIOD_S = 30.0
_PEER_OR_NUMBER = re.compile(r"\b(?:16Uiu2|12D3Koo|Qm)\w+|\d+")


class LibraryDigest(logging.Filter):
    """Holds back the noisy libraries' records (below CRITICAL), counting them by their first
    line; the first record after each period passes as a summary of the period."""

    def __init__(
        self,
        period_s: float = DIGEST_PERIOD_S,
        clock: Callable[[], float] = time.monotonic,
        summarise: bool = True,
    ) -> None:
        super().__init__()
        self.period_s, self.clock, self.summarise = period_s, clock, summarise
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
        if now - self.since < self.period_s or not self.summarise:
            return False
        (common, times), total = self.counts.most_common(1)[0], sum(self.counts.values())
        record.name, record.levelno, record.levelname = "libp2p", logging.WARNING, "WARNING"
        record.msg = "%s warnings from the networking library in %.0f s, most often (%sx): %s"
        record.args = (total, now - self.since, times, common)
        record.exc_info = record.exc_text = record.stack_info = None
        self.counts.clear()
        self.since = now
        return True


class JsonLines(logging.Formatter):
    """One JSON object per record: time (ISO 8601, UTC), node, level, logger, message, and the
    exception's traceback if any, for log collectors that read fields instead of text."""

    def __init__(self, node_name: str | None) -> None:
        super().__init__()
        self.node_name = node_name

    def format(self, record: logging.LogRecord) -> str:
        line = {
            "time": self.formatTime(record),
            "node": self.node_name,
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return dumps(line)

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        return f"{stamp}.{int(record.msecs):03d}Z"


def configure_logging(
    node_name: str | None = None, level: str = "INFO", json: bool = False
) -> None:
    """Log to stderr at ``level`` (a name of ``gwtf.node.settings``' ``log.level``: DEBUG, INFO,
    WARNING, ERROR, CRITICAL), each line naming ``node_name``, as text or (``json``) one JSON
    object per line; the networking libraries' records summarised unless the level is DEBUG.
    Calling it again replaces the previous configuration."""
    number = logging.getLevelName(level.upper())
    if not isinstance(number, int):
        raise ValueError(f"log level {level!r} is none of DEBUG, INFO, WARNING, ERROR, CRITICAL")
    handler = logging.StreamHandler(sys.stderr)
    named = f" {node_name}" if node_name else ""
    handler.setFormatter(
        JsonLines(node_name)
        if json
        else logging.Formatter(f"%(asctime)s{named} %(levelname)s %(name)s: %(message)s")
    )
    # force: whatever logged (or configured) before this call, the settings' level wins.
    logging.basicConfig(level=number, handlers=[handler], force=True)
    for noisy in NOISY:
        library = logging.getLogger(noisy)
        # py-libp2p stops its records at its own logger, which has no handler: Python's last
        # resort printed them bare, without time or node.
        library.propagate = True
        # A record passed up to the root's handlers is not checked against the root's level,
        # only against its own logger's: the libraries' loggers carry the level themselves.
        library.setLevel(number if number <= logging.DEBUG else max(number, logging.WARNING))
    if number > logging.DEBUG:
        # The summary is a WARNING line: above WARNING the libraries' records are only held.
        handler.addFilter(LibraryDigest(summarise=number <= logging.WARNING))
