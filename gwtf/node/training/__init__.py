"""The stage training engine: models split into a data-node part and relay stages, their workers,
the tensor wire codec, checkpoints and the training data. No networking: the node drives it."""
