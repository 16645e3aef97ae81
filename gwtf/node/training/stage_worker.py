"""A relay's stage worker: forward and backward of microbatches through one stage's blocks.

``forward(m, x)`` keeps exactly what ``backward(m, grad)`` needs (the input leaf and the output
graph) in a table keyed by microbatch id; ``backward`` accumulates the stage's gradient and
returns the gradient for upstream; ``drop(m)`` forgets an abandoned microbatch; ``accumulated``
names the microbatches whose gradient the accumulation holds until the next step or discard.
Every check on a peer's tensor happens before any state changes, so a bad tensor leaves the
worker usable.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gwtf.node.training.config import ModelConfig
from gwtf.node.training.errors import ActivationError, CapacityError, UnknownMicrobatchError
from gwtf.node.training.model import Stage
from gwtf.node.training.partition import PartitionPlan
from gwtf.node.training.settings import TrainingSettings
from gwtf.node.training.trainer import PartTrainer


@dataclass
class SavedForward:
    """What backward needs: the input leaf (its .grad goes upstream) and the output graph."""

    inputs: torch.Tensor
    outputs: torch.Tensor


def check_activation(
    tensor: torch.Tensor, config: ModelConfig, dtype: torch.dtype, what: str
) -> None:
    """An activation crossing a stage boundary is (B, T, d_model) with T <= block_size."""
    if tensor.dtype != dtype:
        raise ActivationError(f"{what} has dtype {tensor.dtype}, expected {dtype}")
    if tensor.dim() != 3 or tensor.shape[2] != config.d_model or tensor.shape[0] < 1:
        raise ActivationError(
            f"{what} has shape {tuple(tensor.shape)}, expected (batch, seq, {config.d_model})"
        )
    if not 1 <= tensor.shape[1] <= config.block_size:
        raise ActivationError(
            f"{what} has sequence length {tensor.shape[1]}, expected 1..{config.block_size}"
        )


class StageWorker(PartTrainer):
    """One replica of relay stage ``stage_index`` of ``plan``."""

    def __init__(
        self,
        plan: PartitionPlan,
        stage_index: int,
        settings: TrainingSettings,
        seed: int,
        replica_id: str = "0",
    ) -> None:
        span = plan.stages[stage_index]
        super().__init__(
            Stage(plan.config, span.first_layer, span.end_layer, seed), settings, replica_id
        )
        self.config = plan.config
        self.span = span
        self._saved: dict[int, SavedForward] = {}
        #: Microbatches whose backward the accumulated gradient holds (since the last step).
        self.accumulated: set[int] = set()

    @property
    def in_flight(self) -> tuple[int, ...]:
        """Microbatch ids whose forward is done and whose backward is still awaited."""
        return tuple(sorted(self._saved))

    def forward(self, microbatch_id: int, activation: torch.Tensor) -> torch.Tensor:
        """Run the stage on ``activation`` (B, T, C); returns the output activation on the host.
        A repeated forward for the same id (a re-sent hop) replaces the earlier state."""
        check_activation(activation, self.config, self.device.wire_dtype, "input activation")
        self.drop(microbatch_id)
        if len(self._saved) >= self.settings.max_in_flight:
            raise CapacityError(
                f"stage {self.span.index} already holds {len(self._saved)} microbatches "
                f"(max_in_flight); send microbatch {microbatch_id} to another replica"
            )
        inputs = self.device.from_wire(activation).detach().requires_grad_(True)
        with self.device.autocast():
            outputs = self.module(inputs)  # (B, T, C)
        self._saved[microbatch_id] = SavedForward(inputs, outputs)
        return self.device.to_wire(outputs)

    def backward(self, microbatch_id: int, output_grad: torch.Tensor) -> torch.Tensor:
        """Backpropagate ``output_grad`` (the gradient of the loss with respect to this stage's
        output); accumulate the stage's gradient and return the gradient for its input."""
        saved = self._saved.get(microbatch_id)
        if saved is None:
            raise UnknownMicrobatchError(
                f"stage {self.span.index} holds no forward for microbatch {microbatch_id}; "
                "re-run its forward here or route the gradient to the replica that did"
            )
        if output_grad.shape != saved.outputs.shape:
            raise ActivationError(
                f"gradient for microbatch {microbatch_id} has shape {tuple(output_grad.shape)}, "
                f"expected {tuple(saved.outputs.shape)}"
            )
        if output_grad.dtype != self.device.wire_dtype:
            raise ActivationError(
                f"gradient for microbatch {microbatch_id} has dtype {output_grad.dtype}, "
                f"expected {self.device.wire_dtype}"
            )
        del self._saved[microbatch_id]
        grad = self.device.from_wire(output_grad).to(saved.outputs.dtype)
        torch.autograd.backward(saved.outputs, grad)
        self.microbatch_count += 1
        self.accumulated.add(microbatch_id)
        assert saved.inputs.grad is not None  # inputs is a leaf that requires grad
        return self.device.to_wire(saved.inputs.grad)

    def discard_gradients(self) -> None:
        super().discard_gradients()
        self.accumulated.clear()

    def drop(self, microbatch_id: int) -> bool:
        """Forget an abandoned microbatch's saved state; returns whether any was held."""
        return self._saved.pop(microbatch_id, None) is not None

    def drop_all(self) -> int:
        """Forget every microbatch in flight (iteration aborted); returns how many."""
        count = len(self._saved)
        self._saved.clear()
        return count
