"""What a swarm must reproduce: the whole model trained alone on the same microbatch ids.

Every data node starts the microbatches ``(iteration * data_nodes + shard) * batch + j`` of each
iteration and every stage averages the gradients of all of them, so a swarm that loses nothing
steps exactly like one model accumulating those microbatches in turn (summation order aside).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gwtf.node.training.dataset import run_sampler
from gwtf.node.training.partition import model_for_run, plan_partition
from gwtf.node.training.settings import TrainingSettings
from gwtf.node.training.shards import run_vocab
from gwtf.node.training.trainer import WholeModelTrainer
from gwtf.node.training.validation import due, run_validation_batches, validation_loss


def iteration_microbatches(training: TrainingSettings, iteration: int) -> list[int]:
    """The ids of every data node's microbatches of ``iteration``."""
    batch, shards = training.microbatches_per_iteration, training.data_nodes
    first = iteration * shards * batch
    return list(range(first, first + shards * batch))


@dataclass
class ReferenceRun:
    #: The mean loss of each iteration, before its step.
    losses: list[float] = field(default_factory=list)
    #: (iteration, validation loss after its step), every ``training.validation_every``.
    validation: list[tuple[int, float]] = field(default_factory=list)
    #: The trained model, after the last iteration's step.
    trainer: WholeModelTrainer | None = None


def whole_model_run(training: TrainingSettings, iterations: int) -> ReferenceRun:
    """The whole model trained alone for ``iterations`` iterations of the run's microbatches."""
    config = model_for_run(
        training.model,
        training.seq_len,
        training.stages,
        run_vocab(training.data, training.vocab_size),
    )
    trainer = WholeModelTrainer(plan_partition(config, training.stages), training, training.seed)
    sampler = run_sampler(training.data, training.batch_size, training.seq_len, training.seed)
    held_out = run_validation_batches(training) if training.validation_every else []
    device = trainer.device

    def loss_of(inputs, targets):  # type: ignore[no-untyped-def]
        with device.autocast():
            return trainer.model(device.to_device(inputs), device.to_device(targets))

    run = ReferenceRun()
    for iteration in range(iterations):
        ids = iteration_microbatches(training, iteration)
        run.losses.append(sum(trainer.train_microbatch(*sampler(m)) for m in ids) / len(ids))
        trainer.step()
        if due(training, iteration):
            loss = validation_loss(loss_of, held_out)
            if loss is not None:
                run.validation.append((iteration, loss))
    run.trainer = trainer
    return run


def whole_model_losses(training: TrainingSettings, iterations: int) -> list[float]:
    """The mean loss of each of the first ``iterations`` iterations, before its step."""
    return whole_model_run(training, iterations).losses


def worst_relative_difference(losses: list[float], reference: list[float]) -> float:
    """max |loss - reference| / |reference| over the iterations both have."""
    pairs = list(zip(losses, reference, strict=False))
    return max((abs(a - b) / abs(b) for a, b in pairs), default=0.0)
