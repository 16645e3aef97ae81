"""`gwtf-node demo`: the on-chain lifecycle of one epoch, every number read back from the chain."""
