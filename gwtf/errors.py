"""The error hierarchy shared by every layer of GWTF.

Every error a person can meet is a ``GwtfError`` whose message says what failed and what to do.
Adapters translate library errors at their boundary and keep the cause
(``raise ChainUnavailable(url) from exc``); the CLI prints ``str(err)`` on one line and exits with
``err.exit_code``. This module imports nothing, so the pure core may use it too.
"""

from __future__ import annotations


class GwtfError(Exception):
    """Root of every error GWTF raises on purpose; its message is meant for a person."""

    #: Process exit code the CLI uses for this family of errors (documented in the README).
    exit_code: int = 1


class ConfigError(GwtfError):
    """A setting, flag or input file is invalid; the message names it and how to fix it."""

    exit_code = 2


class ChainError(GwtfError):
    """Talking to the chain failed (unreachable node, reverted transaction, missing artifacts)."""

    exit_code = 3


class WalletError(GwtfError):
    """The keystore could not be opened (wrong password, missing file) or lacks funds."""

    exit_code = 4


class ProtocolError(GwtfError):
    """A peer sent something malformed, oversized or out of protocol."""

    exit_code = 5


class TrainingError(GwtfError):
    """The stage engine was handed something it cannot use (shape, dtype, unknown microbatch)."""

    exit_code = 6


class NotBuiltError(GwtfError):
    """A capability that is designed but not built yet; the message says which issue builds it."""

    exit_code = 7


class NodeNotRunning(GwtfError):
    """No node answers on this machine's local API: the command needs a running node."""

    exit_code = 8
