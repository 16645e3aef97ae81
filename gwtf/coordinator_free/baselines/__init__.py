"""The algorithms GWTF is compared with: SWARM, DT-FM and the centralised optimum."""
