"""What a swarm must reproduce: the whole model trained alone on the same microbatch ids.

Every data node starts the microbatches ``(iteration * data_nodes + shard) * batch + j`` of each
iteration and every stage averages the gradients of all of them, so a swarm that loses nothing
steps exactly like one model accumulating those microbatches in turn (summation order aside).
"""

from __future__ import annotations

from node.training.data import MicrobatchSampler, load_default_corpus
from node.training.partition import model_for_run, plan_partition
from node.training.settings import TrainingSettings
from node.training.trainer import WholeModelTrainer


def iteration_microbatches(training: TrainingSettings, iteration: int) -> list[int]:
    """The ids of every data node's microbatches of ``iteration``."""
    batch, shards = training.microbatches_per_iteration, training.data_nodes
    first = iteration * shards * batch
    return list(range(first, first + shards * batch))


def whole_model_losses(training: TrainingSettings, iterations: int) -> list[float]:
    """The mean loss of each of the first ``iterations`` iterations, before its step."""
    config = model_for_run(training.model, training.seq_len, training.stages)
    trainer = WholeModelTrainer(plan_partition(config, training.stages), training, training.seed)
    sampler = MicrobatchSampler(load_default_corpus(), training.batch_size, training.seq_len)
    losses = []
    for iteration in range(iterations):
        ids = iteration_microbatches(training, iteration)
        losses.append(sum(trainer.train_microbatch(*sampler(m)) for m in ids) / len(ids))
        trainer.step()
    return losses


def worst_relative_difference(losses: list[float], reference: list[float]) -> float:
    """max |loss - reference| / |reference| over the iterations both have."""
    pairs = list(zip(losses, reference, strict=False))
    return max((abs(a - b) / abs(b) for a, b in pairs), default=0.0)
