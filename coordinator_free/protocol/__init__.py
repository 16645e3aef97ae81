"""GWTF's coordinator-free flow protocol: one node's pure, deterministic state machine."""

from coordinator_free.protocol.config import DATA, RELAY, FlowConfig, NodeSpec, Outbound
from coordinator_free.protocol.node import FlowNode

__all__ = ["DATA", "RELAY", "FlowConfig", "FlowNode", "NodeSpec", "Outbound"]
