"""The typed errors of the flow protocol core (wire, cost model, config), rooted in GwtfError."""

from __future__ import annotations

from gwtf.errors import ConfigError, ProtocolError


class WireFormatError(ProtocolError):
    """Bytes from a peer are not a valid flow-protocol message (version, type, length, field)."""


class CostModelError(ConfigError):
    """A cost-model input is out of range (negative time, zero bandwidth, not a number)."""


class FlowConfigError(ConfigError):
    """A flow-protocol parameter is out of range; the message names it."""


class PlacementError(ConfigError):
    """A stage choice was asked for with no stages to choose from."""
