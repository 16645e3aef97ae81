"""GWTF's coordinator-free flow protocol: one node's pure, deterministic state machine."""

from gwtf.coordinator_free.protocol.config import DATA, RELAY, FlowConfig, NodeSpec, Outbound
from gwtf.coordinator_free.protocol.node import FlowNode

__all__ = ["DATA", "RELAY", "FlowConfig", "FlowNode", "NodeSpec", "Outbound"]
