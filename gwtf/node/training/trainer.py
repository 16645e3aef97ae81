"""What every trainable part shares: gradient accumulation over microbatches, weighted averaging
across any subset of replicas, and the clipped, scheduled AdamW step.

Gradients accumulate as *sums* over microbatches; a replica shares its sum and its microbatch
count, and averaging divides the sum over the shares by the total count. That is the mean gradient
over every microbatch the live replicas processed, whichever replica processed which, so a dead
replica is simply left out. Shares are summed in replica-id order, so every replica computes the
same average bit for bit and replicas stay identical after the step.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from gwtf.errors import TrainingError
from gwtf.node.training.device import DeviceContext
from gwtf.node.training.errors import GradientShareError
from gwtf.node.training.model import WholeModel
from gwtf.node.training.optim import build_adamw, clip_gradients, lr_at, optimizer_param_names
from gwtf.node.training.partition import PartitionPlan
from gwtf.node.training.settings import TrainingSettings


@dataclass(frozen=True)
class GradientShare:
    """One replica's contribution to a stage's average: gradient sums (host tensors, read only)
    over ``microbatch_count`` microbatches."""

    replica_id: str
    microbatch_count: int
    gradients: Mapping[str, torch.Tensor]


@dataclass(frozen=True)
class StepReport:
    step: int
    lr: float
    grad_norms: tuple[float, ...]
    microbatch_count: int


class PartTrainer:
    """A module with its optimizer, accumulation counter and step; base of the stage worker, the
    data node and the whole-model reference."""

    def __init__(
        self,
        module: nn.Module,
        settings: TrainingSettings,
        replica_id: str,
        clip_groups: Sequence[Sequence[str]] | None = None,
    ) -> None:
        self.settings = settings
        self.device = DeviceContext(settings)
        self.module = module.to(device=self.device.device, dtype=self.device.param_dtype)
        self.replica_id = replica_id
        self.named_params = list(self.module.named_parameters())
        self.optimizer = build_adamw(self.named_params, settings.optimizer)
        self.optimizer_names = optimizer_param_names(self.named_params)
        by_name = dict(self.named_params)
        groups = clip_groups if clip_groups is not None else [list(by_name)]
        self._clip_groups = [[by_name[name] for name in group] for group in groups]
        self.step_count = 0
        self.microbatch_count = 0
        self._averaged = False

    def gradient_share(self) -> GradientShare:
        """This replica's gradient sums and count, as host tensors for the wire."""
        gradients = {
            name: self.device.to_host(param.grad)
            if param.grad is not None
            else torch.zeros(param.shape, dtype=param.dtype)
            for name, param in self.named_params
        }
        return GradientShare(self.replica_id, self.microbatch_count, gradients)

    def average_gradients(self, shares: Sequence[GradientShare]) -> int:
        """Replace the local gradient by the mean over every microbatch in ``shares`` (any subset
        of the stage's replicas, weighted by their counts); returns the total count."""
        self._check_shares(shares)
        total = sum(share.microbatch_count for share in shares)
        if total == 0:
            raise GradientShareError("no replica processed a microbatch; nothing to average")
        ordered = sorted(shares, key=lambda share: share.replica_id)
        for name, param in self.named_params:
            summed = torch.zeros_like(param)
            for share in ordered:
                summed += self.device.to_device(share.gradients[name]).to(param.dtype)
            # A new tensor, never in place: the shares may alias other replicas' gradients.
            param.grad = summed / total
        self.microbatch_count = total
        self._averaged = True
        return total

    def _check_shares(self, shares: Sequence[GradientShare]) -> None:
        replica_ids = [share.replica_id for share in shares]
        if len(set(replica_ids)) != len(replica_ids):
            raise GradientShareError(f"duplicate replica ids in gradient shares: {replica_ids}")
        expected = {name: tuple(param.shape) for name, param in self.named_params}
        for share in shares:
            if share.microbatch_count < 0:
                raise GradientShareError(
                    f"replica {share.replica_id} claims {share.microbatch_count} microbatches"
                )
            if set(share.gradients) != set(expected):
                raise GradientShareError(
                    f"replica {share.replica_id} shares gradients of other parameters; "
                    "is it serving the same stage?"
                )
            for name, grad in share.gradients.items():
                if tuple(grad.shape) != expected[name] or not grad.dtype.is_floating_point:
                    raise GradientShareError(
                        f"replica {share.replica_id}: gradient {name} is {grad.dtype} "
                        f"{tuple(grad.shape)}, expected floating {expected[name]}"
                    )

    def step(self) -> StepReport:
        """Clip (per clip group), set the scheduled learning rate, take one AdamW step."""
        if self.microbatch_count == 0:
            raise TrainingError(
                "no microbatch gradient was accumulated since the last step; run backward first"
            )
        if not self._averaged:
            for _, param in self.named_params:
                if param.grad is not None:
                    param.grad.div_(self.microbatch_count)
        max_norm = self.settings.optimizer.grad_clip_norm
        norms = tuple(clip_gradients(group, max_norm) for group in self._clip_groups)
        lr = lr_at(self.step_count, self.settings.optimizer)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.step()
        report = StepReport(self.step_count, lr, norms, self.microbatch_count)
        self.discard_gradients()
        self.step_count += 1
        return report

    def discard_gradients(self) -> None:
        """Forget this iteration's accumulated gradients (e.g. after an aborted iteration)."""
        self.optimizer.zero_grad(set_to_none=True)
        self.microbatch_count = 0
        self._averaged = False

    def weights_version(self) -> tuple[int, ...]:
        """Moves whenever a weight changes (a step, a loaded state, any in-place write): the
        version counter torch keeps of each parameter. Equal versions: the same weights."""
        return tuple(param._version for _, param in self.named_params)

    def parameters_by_name(self) -> dict[str, torch.Tensor]:
        return {name: param.detach() for name, param in self.named_params}


class WholeModelTrainer(PartTrainer):
    """The unsplit reference: the same modules, seeds, optimizer and per-part clipping as a split
    model under ``plan``, trained with plain gradient accumulation."""

    def __init__(
        self, plan: PartitionPlan, settings: TrainingSettings, seed: int, replica_id: str = "whole"
    ) -> None:
        model = WholeModel(plan.config, seed)
        names = [name for name, _ in model.named_parameters()]
        groups = [[name for name in names if name.startswith("data.")]]
        for span in plan.stages:
            prefixes = tuple(
                f"body.blocks.{layer}." for layer in range(span.first_layer, span.end_layer)
            )
            groups.append([name for name in names if name.startswith(prefixes)])
        super().__init__(model, settings, replica_id, clip_groups=groups)
        self.model = model

    def train_microbatch(self, inputs: torch.Tensor, targets: torch.Tensor) -> float:
        """Forward and backward of one microbatch; returns its mean token loss."""
        with self.device.autocast():
            loss = self.model(self.device.to_device(inputs), self.device.to_device(targets))
        torch.autograd.backward(loss)
        self.microbatch_count += 1
        return float(loss.detach())


def average_gradients(replicas: Sequence[PartTrainer]) -> int:
    """In-process averaging over the given replicas of one part (the live ones); returns the
    total microbatch count. Over the network, each replica sends ``gradient_share()`` and calls
    ``average_gradients`` on the shares it received, which gives the same result."""
    shares = [replica.gradient_share() for replica in replicas]
    total = 0
    for replica in replicas:
        total = replica.average_gradients(shares)
    return total
