"""What a stage's replicas share: gradient averaging, and the stage state a joiner or a replica
behind loads."""
