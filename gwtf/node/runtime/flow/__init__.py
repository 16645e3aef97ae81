"""The flow protocol on the live host, and the routing switch between it and SWARM's wiring."""
