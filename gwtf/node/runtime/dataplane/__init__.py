"""Hops between live nodes: the envelope, the acknowledged exchange and its compute queue, sending
hops on with re-sends, repairing late microbatches, and the control requests they use."""
