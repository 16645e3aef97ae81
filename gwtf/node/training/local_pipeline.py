"""An in-process pipeline: a data-node part and S stages with R replicas each, wired by direct
calls. It runs the same workers the node runs over the network, with the network replaced by the
codec's round trip, and serves the benchmark, the equivalence proof and local experiments."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from gwtf.node.training.codec import CodecLimits, decode, encode
from gwtf.node.training.data_node import DataNodeWorker
from gwtf.node.training.dataset import Sampler
from gwtf.node.training.partition import PartitionPlan
from gwtf.node.training.settings import TrainingSettings
from gwtf.node.training.stage_worker import StageWorker
from gwtf.node.training.trainer import StepReport, average_gradients

#: (microbatch id, stage index) -> index of the replica of that stage that serves it.
Route = Callable[[int, int], int]


def round_robin(microbatch_id: int, stage_index: int, n_replicas: int) -> int:
    """Spread microbatches over replicas, shifted per stage so paths cross between replicas."""
    return (microbatch_id + stage_index) % n_replicas


class LocalPipeline:
    def __init__(
        self,
        plan: PartitionPlan,
        settings: TrainingSettings,
        seed: int,
        batches: Sampler,
        n_replicas: int = 1,
        through_codec: bool = True,
    ) -> None:
        self.data_node = DataNodeWorker(plan, settings, seed, batches, replica_id="data")
        self.stages: list[list[StageWorker]] = [
            [StageWorker(plan, s, settings, seed, replica_id=f"r{r}") for r in range(n_replicas)]
            for s in range(plan.n_stages)
        ]
        self.limits = CodecLimits.from_settings(settings)
        self.through_codec = through_codec

    def wire(self, microbatch_id: int, tensor: torch.Tensor) -> torch.Tensor:
        """What the receiving node sees: the tensor after encode and decode."""
        if not self.through_codec:
            return tensor
        frame = bytearray(encode(microbatch_id, tensor, self.limits))
        return decode(frame, self.limits).tensor

    def run_microbatch(self, microbatch_id: int, route: Route) -> float:
        """One microbatch's forward and backward along the routed path; returns its loss."""
        path = [replicas[route(microbatch_id, s)] for s, replicas in enumerate(self.stages)]
        activation = self.data_node.embed(microbatch_id)
        for worker in path:
            activation = worker.forward(microbatch_id, self.wire(microbatch_id, activation))
        loss, grad = self.data_node.loss_and_backward(
            microbatch_id, self.wire(microbatch_id, activation)
        )
        for worker in reversed(path):
            grad = worker.backward(microbatch_id, self.wire(microbatch_id, grad))
        self.data_node.backward_embedding(microbatch_id, self.wire(microbatch_id, grad))
        return loss

    def finish_iteration(
        self, live: Sequence[Sequence[StageWorker]] | None = None
    ) -> list[StepReport]:
        """Average each stage's gradients over its live replicas and step every part."""
        reports = [self.data_node.step()]
        for replicas in live if live is not None else self.stages:
            average_gradients(replicas)
            reports.extend(replica.step() for replica in replicas)
        return reports
