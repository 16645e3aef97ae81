"""The node's peer-to-peer layer: identity, host, framed request/response, peer scoring, link emulation."""
