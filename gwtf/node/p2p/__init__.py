"""The node's p2p layer: identity, host, framed request/response, scoring, link emulation."""
