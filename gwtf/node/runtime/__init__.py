"""The live node on the p2p layer: its roles, the data plane, the flow protocol's service,
discovery and admission, and the state its stage's replicas share."""
