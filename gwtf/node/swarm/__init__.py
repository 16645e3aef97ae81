"""`gwtf-node swarm`: a whole training swarm as OS processes on loopback, with its own chain."""
