"""Where a part computes: device choice, bf16 autocast and host<->device transfers.

CPU and CUDA take the same code path; only this module looks at the device type. On CUDA, tensors
leave the device through pinned host buffers (page-locked memory is what lets the copy run as DMA)
and arrive through them too.
"""

from __future__ import annotations

import contextlib
from contextlib import AbstractContextManager

import torch

from gwtf.node.training.errors import ModelConfigError
from gwtf.node.training.settings import TrainingSettings


def resolve_device(choice: str) -> torch.device:
    """``auto`` takes CUDA when present; asking for ``cuda`` without one is a config error."""
    if choice == "cpu":
        return torch.device("cpu")
    if choice == "cuda" or choice == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if choice == "cuda":
            raise ModelConfigError(
                "training.device='cuda' but no CUDA device is visible; use 'cpu' or 'auto'"
            )
        return torch.device("cpu")
    raise ModelConfigError(f"training.device={choice!r} is not one of 'auto', 'cuda', 'cpu'")


class DeviceContext:
    """The device, master dtype and autocast policy one part computes with."""

    def __init__(self, settings: TrainingSettings) -> None:
        settings.validate()
        self.device = resolve_device(settings.device)
        self.param_dtype = settings.torch_param_dtype
        #: What this part's activations and gradients travel as (``training.wire_dtype``).
        self.wire_dtype = settings.torch_wire_dtype
        self.is_cuda = self.device.type == "cuda"
        self.uses_autocast = self.is_cuda and settings.bf16_autocast

    def autocast(self) -> AbstractContextManager[object]:
        if self.uses_autocast:
            return torch.autocast(device_type="cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def to_device(self, tensor: torch.Tensor) -> torch.Tensor:
        """A host tensor (e.g. decoded from the wire) on this device; on CPU, the same storage."""
        if not self.is_cuda:
            return tensor
        if tensor.device.type == "cpu" and not tensor.is_pinned():
            tensor = tensor.pin_memory()
        return tensor.to(self.device, non_blocking=True)

    def to_host(self, tensor: torch.Tensor) -> torch.Tensor:
        """A detached host copy ready for the codec; on CUDA it lives in pinned memory."""
        tensor = tensor.detach()
        if not self.is_cuda:
            return tensor
        pinned = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
        pinned.copy_(tensor, non_blocking=True)
        # The caller reads the buffer next (encode, send): wait for the copy to land.
        torch.cuda.current_stream(self.device).synchronize()
        return pinned

    def from_wire(self, tensor: torch.Tensor) -> torch.Tensor:
        """A received activation or gradient on this device, in the master dtype."""
        return self.to_device(tensor).to(self.param_dtype)

    def to_wire(self, tensor: torch.Tensor) -> torch.Tensor:
        """An activation or gradient to send: on the host, in the run's wire dtype."""
        return self.to_host(tensor.to(self.wire_dtype))

    def synchronize(self) -> None:
        if self.is_cuda:
            torch.cuda.synchronize(self.device)
