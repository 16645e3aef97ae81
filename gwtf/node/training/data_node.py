"""The data node's part of the pipeline: it starts a microbatch (embedding), ends it (final norm,
LM head, loss, and the gradient sent back to the last stage) and closes the loop (embedding
backward with the gradient that comes back from the first stage).

Tokens are never sent: both ends regenerate a microbatch's tokens from its id (``batches``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from gwtf.node.training.dataset import Sampler
from gwtf.node.training.errors import ActivationError, CapacityError, UnknownMicrobatchError
from gwtf.node.training.model import DataPart
from gwtf.node.training.partition import PartitionPlan
from gwtf.node.training.settings import TrainingSettings
from gwtf.node.training.stage_worker import check_activation
from gwtf.node.training.trainer import GradientShare, PartTrainer


class DataNodeWorker(PartTrainer):
    """One replica of the data-node part. Each microbatch is counted once, when its loss is
    computed, so counts add up to the number of microbatches across data-node replicas even when
    one replica embeds a microbatch and another computes its loss. A microbatch's loss computed
    again before it closes (a restarted try's forward reached the loss once more) replaces the
    earlier one's contribution: its head gradient and count enter the step once."""

    def __init__(
        self,
        plan: PartitionPlan,
        settings: TrainingSettings,
        seed: int,
        batches: Sampler,
        replica_id: str = "0",
    ) -> None:
        super().__init__(DataPart(plan.config, seed), settings, replica_id)
        self.config = plan.config
        self.part: DataPart = self.module  # type: ignore[assignment]
        self.batches = batches
        self._embedded: dict[int, torch.Tensor] = {}
        #: The final activation each microbatch's loss in the accumulated gradient came from,
        #: until the microbatch closes or the gradient is stepped or discarded: what undoing
        #: that contribution recomputes.
        self._loss_inputs: dict[int, torch.Tensor] = {}

    @property
    def in_flight(self) -> tuple[int, ...]:
        return tuple(sorted(self._embedded))

    def embed(self, microbatch_id: int) -> torch.Tensor:
        """Start microbatch ``microbatch_id``: its first activation (B, T, C) on the host."""
        self.drop(microbatch_id)
        if len(self._embedded) >= self.settings.max_in_flight:
            raise CapacityError(
                f"data node already holds {len(self._embedded)} microbatches (max_in_flight)"
            )
        inputs, _ = self.batches(microbatch_id)
        with self.device.autocast():
            activation = self.part.embed(self.device.to_device(inputs))  # (B, T, C)
        self._embedded[microbatch_id] = activation
        return self.device.to_wire(activation)

    def loss_and_backward(
        self, microbatch_id: int, final_activation: torch.Tensor
    ) -> tuple[float, torch.Tensor]:
        """End the forward of a microbatch: mean token loss, and the gradient with respect to
        the last stage's output to send back to it. A loss of the microbatch already in the
        accumulated gradient (its microbatch not closed since) is taken out first."""
        check_activation(final_activation, self.config, self.device.wire_dtype, "final activation")
        _, targets = self.batches(microbatch_id)
        if tuple(targets.shape) != tuple(final_activation.shape[:2]):
            raise ActivationError(
                f"final activation for microbatch {microbatch_id} has shape "
                f"{tuple(final_activation.shape)}, but its targets are {tuple(targets.shape)}"
            )
        earlier = self._loss_inputs.pop(microbatch_id, None)
        if earlier is not None:
            self._head_backward(earlier, targets, sign=-1.0)
            self.microbatch_count -= 1
        loss, grad = self._head_backward(final_activation, targets, sign=1.0)
        self._loss_inputs[microbatch_id] = final_activation
        self.microbatch_count += 1
        return float(loss.detach()), self.device.to_wire(grad)

    def _head_backward(
        self, final_activation: torch.Tensor, targets: torch.Tensor, sign: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The loss of ``final_activation`` and its gradient; adds ``sign`` times the loss's
        gradient to the part's accumulated gradient (-1: takes an earlier one out again)."""
        x = self.device.from_wire(final_activation).detach().requires_grad_(True)
        with self.device.autocast():
            loss = self.part.loss(x, self.device.to_device(targets))
        torch.autograd.backward(loss if sign == 1.0 else sign * loss)
        assert x.grad is not None  # x is a leaf that requires grad
        return loss, x.grad

    def backward_embedding(self, microbatch_id: int, input_grad: torch.Tensor) -> None:
        """Close a microbatch: backpropagate the first stage's input gradient into the
        embeddings."""
        activation = self._embedded.get(microbatch_id)
        if activation is None:
            raise UnknownMicrobatchError(
                f"data node holds no embedding for microbatch {microbatch_id}; "
                "send the gradient to the data node that started it"
            )
        check_activation(input_grad, self.config, self.device.wire_dtype, "embedding gradient")
        if input_grad.shape != activation.shape:
            raise ActivationError(
                f"embedding gradient for microbatch {microbatch_id} has shape "
                f"{tuple(input_grad.shape)}, expected {tuple(activation.shape)}"
            )
        del self._embedded[microbatch_id]
        self._loss_inputs.pop(microbatch_id, None)  # closed: its loss is final
        torch.autograd.backward(activation, self.device.from_wire(input_grad).to(activation.dtype))

    def drop(self, microbatch_id: int) -> bool:
        """Forget a given-up try's embedding output; returns whether one was held (False: the
        try's gradient reached the embedding already). A loss of the microbatch stays in the
        accumulated gradient (a later try's replaces it)."""
        return self._embedded.pop(microbatch_id, None) is not None

    def average_gradients(self, shares: Sequence[GradientShare]) -> int:
        self._loss_inputs.clear()  # the average replaces this replica's sum: nothing to undo
        return super().average_gradients(shares)

    def discard_gradients(self) -> None:
        super().discard_gradients()
        self._loss_inputs.clear()
