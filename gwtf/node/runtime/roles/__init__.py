"""What a live node does in its role: a relay's stage, a data node's microbatches and iterations,
the data nodes of one run among themselves, and the flows they lend each other."""
