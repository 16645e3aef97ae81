"""The memory one part of the model takes where it trains, in bytes, computed from its modules,
and whether it fits the memory this machine offers.

A part holds its weights (and buffers), a gradient of each weight (from its first backward on),
AdamW's two moments of each weight, and the activations autograd saves in a forward until its
backward, for each microbatch in flight: up to ``training.max_in_flight`` of them, the bound the
worker enforces. Everything is measured on the part itself built under torch's ``FakeTensorMode``:
tensors with shapes, dtypes and storages but no data, so a 1B-parameter stage costs no memory and
about a second. One forward of the run's microbatch (B, T) runs with a saved-tensors hook that
adds up the distinct storages autograd keeps, weights left out; the device's own kernels run
(on CPU, flash attention saves a log-sum-exp per row, not a T x T matrix), so what is counted is
what that device keeps. A relay also keeps each microbatch's output until its backward; a data
node keeps each embedding, and its loss pass (final norm, head, logits, log-softmax) is counted
once, for one microbatch at a time.

Not counted: transient buffers of a single kernel, the gradients a backward passes on, received
gradient shares while a stage averages (one part's size per replica, for a moment), and the
allocator's slack; and under bf16 autocast on CUDA the forward's saved tensors are counted in
bf16 where autocast casts them. ``tests/training/test_memory.py`` bounds the estimate against
torch's real allocation on CPU.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

from gwtf.errors import ConfigError
from gwtf.node.training.device import DeviceContext
from gwtf.node.training.model import DataPart, Stage
from gwtf.node.training.partition import PartitionPlan
from gwtf.node.training.settings import TrainingSettings

MIB = 2**20


class StageMemoryError(ConfigError):
    """A part does not fit the memory this node offers."""


@dataclass(frozen=True)
class PartMemory:
    """Bytes a part takes: ``part`` is 0 for the data node's part, 1..S for a relay stage."""

    part: int
    weights: int  # parameters and buffers
    gradients: int
    optimizer: int  # AdamW's first and second moments
    activations_per_microbatch: int
    in_flight: int  # microbatches whose forward state it may hold at once
    working: int = 0  # the data node's loss pass, for one microbatch at a time

    @property
    def activations(self) -> int:
        return self.activations_per_microbatch * self.in_flight + self.working

    @property
    def total(self) -> int:
        return self.weights + self.gradients + self.optimizer + self.activations

    def describe(self) -> str:
        name = "the data node's part" if self.part == 0 else f"stage {self.part}"
        return (
            f"{name} needs {_mib(self.total)} (weights {_mib(self.weights)}, gradients "
            f"{_mib(self.gradients)}, AdamW {_mib(self.optimizer)}, activations "
            f"{_mib(self.activations)} for {self.in_flight} microbatches in flight)"
        )


def _mib(count: int) -> str:
    return f"{count / MIB:,.1f} MiB"


def part_memory(plan: PartitionPlan, part: int, settings: TrainingSettings) -> PartMemory:
    """The memory of part ``part`` (0: the data node's; 1..S: relay stage ``part``) training
    microbatches of ``settings.batch_size`` x ``settings.seq_len`` on ``settings.device``."""
    device = DeviceContext(settings)
    config = plan.config
    batch, seq = settings.batch_size, settings.seq_len
    with FakeTensorMode(), torch.device(device.device):
        module: nn.Module
        if part == 0:
            module = DataPart(config, 0)
        else:
            span = plan.stages[part - 1]
            module = Stage(config, span.first_layer, span.end_layer, 0)
        _cast_floating(module, device.param_dtype)
        kept = {_storage_key(t) for t in (*module.parameters(), *module.buffers())}
        param_bytes = _distinct_bytes(list(module.parameters()))
        weights = _distinct_bytes([*module.parameters(), *module.buffers()])
        x = torch.empty((batch, seq, config.d_model), dtype=device.param_dtype)
        if part == 0:
            data = module
            assert isinstance(data, DataPart)
            tokens = torch.zeros((batch, seq), dtype=torch.long)
            per_microbatch = _saved_bytes(lambda: data.embed(tokens), kept, device)
            working = _saved_bytes(
                lambda: data.loss(x.requires_grad_(True), tokens), kept, device, output=False
            )
        else:
            per_microbatch = _saved_bytes(lambda: module(x.requires_grad_(True)), kept, device)
            working = 0
    return PartMemory(
        part,
        weights=weights,
        gradients=param_bytes,
        optimizer=2 * param_bytes,
        activations_per_microbatch=per_microbatch,
        in_flight=settings.max_in_flight,
        working=working,
    )


def _cast_floating(module: nn.Module, dtype: torch.dtype) -> None:
    """Floating parameters and buffers in the master dtype, as ``PartTrainer``'s
    ``module.to(dtype)`` casts them (which fake tensors cannot go through); a tied weight
    stays one tensor."""
    cast: dict[int, torch.Tensor] = {}
    for owner in module.modules():
        for table in (owner._parameters, owner._buffers):
            for name, tensor in table.items():
                if tensor is None or not tensor.is_floating_point() or tensor.dtype == dtype:
                    continue
                if id(tensor) not in cast:
                    converted = tensor.detach().to(dtype)
                    is_param = isinstance(tensor, nn.Parameter)
                    cast[id(tensor)] = nn.Parameter(converted) if is_param else converted
                table[name] = cast[id(tensor)]  # type: ignore[assignment]


def _storage_key(tensor: torch.Tensor) -> int:
    return int(tensor.untyped_storage()._cdata)


def _distinct_bytes(tensors: list[torch.Tensor]) -> int:
    storages = {_storage_key(t): t.untyped_storage().nbytes() for t in tensors}
    return sum(storages.values())


def _saved_bytes(
    forward: Callable[[], torch.Tensor],
    weights: set[int],
    device: DeviceContext,
    output: bool = True,
) -> int:
    """Bytes of the distinct storages autograd saves in ``forward`` (and its output's, which
    the worker keeps), weights left out."""
    saved: list[torch.Tensor] = []

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        saved.append(tensor)
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor), device.autocast():
        result = forward()
    if output:
        saved.append(result)
    storages = {
        _storage_key(t): t.untyped_storage().nbytes()
        for t in saved
        if _storage_key(t) not in weights
    }
    return sum(storages.values())


def memory_budget(settings: TrainingSettings) -> tuple[int, str]:
    """The bytes a part may take here, and where the figure comes from: free device memory on
    CUDA, available RAM on CPU, or ``training.memory_limit_mib`` where it is lower."""
    device = DeviceContext(settings).device
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        budget, source = int(free), f"free memory of {torch.cuda.get_device_name(device)}"
    else:
        budget, source = _available_ram(), "available RAM"
    cap = settings.memory_limit_mib * MIB
    if cap and cap < budget:
        return cap, f"training.memory_limit_mib = {settings.memory_limit_mib}"
    return budget, source


def _available_ram() -> int:
    """MemAvailable from /proc/meminfo (what can be allocated without swapping), else all RAM."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


@dataclass(frozen=True)
class MemoryFit:
    """A part's memory against what this node offers it."""

    memory: PartMemory
    budget: int
    source: str  # where ``budget`` comes from, in words

    @property
    def fits(self) -> bool:
        return self.memory.total <= self.budget

    def refusal(self) -> str:
        """The one line a node says when the part does not fit: what to change."""
        return (
            f"{self.memory.describe()}, more than the {_mib(self.budget)} of {self.source}: "
            f"lower training.max_in_flight ({self.memory.in_flight}), batch_size or seq_len, "
            "split the model into more stages, or use a machine with more memory"
        )

    def check(self) -> None:
        """Refuse a part that does not fit (``StageMemoryError``, one line saying what to do)."""
        if not self.fits:
            raise StageMemoryError(self.refusal())


def memory_fit(plan: PartitionPlan, part: int, settings: TrainingSettings) -> MemoryFit:
    """Part ``part``'s memory against this node's budget (``memory_budget``)."""
    budget, source = memory_budget(settings)
    return MemoryFit(part_memory(plan, part, settings), budget, source)
