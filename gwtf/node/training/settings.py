"""The ``training`` section of the node's settings, the one ``TrainingSettings`` of the project:
what is trained (model, stages, microbatch shape, seed, iterations) and how (device, precision,
optimizer, schedule, wire limits). ``gwtf.node.settings`` loads it from ``[training]`` and
``[training.optimizer]``; the stage engine reads it. Frozen and validated at start-up, so a bad
value stops the node with a message that names it instead of failing mid-run.

Importing this module does not import torch (the command line reads settings for every command).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from gwtf.node.training.errors import ModelConfigError

if TYPE_CHECKING:
    import torch

DeviceChoice = Literal["auto", "cuda", "cpu"]
ParamDtypeName = Literal["float32", "float64"]
WireDtypeName = Literal["param", "bfloat16", "float16"]

PARAM_DTYPES = ("float32", "float64")
WIRE_DTYPES = ("param", "bfloat16", "float16")


@dataclass(frozen=True)
class OptimizerSettings:
    """AdamW with per-part gradient-norm clipping and linear warmup then cosine decay."""

    lr: float = 3e-4
    min_lr: float = 3e-5
    warmup_steps: int = 10
    total_steps: int = 1000
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    grad_clip_norm: float = 1.0

    def validate(self) -> None:
        if not 0.0 <= self.min_lr <= self.lr:
            raise ModelConfigError(
                f"training.optimizer: need 0 <= min_lr ({self.min_lr}) <= lr ({self.lr})"
            )
        if self.warmup_steps < 0 or self.total_steps < 1:
            raise ModelConfigError(
                "training.optimizer: warmup_steps must be >= 0 and total_steps >= 1, got "
                f"{self.warmup_steps} and {self.total_steps}"
            )
        if not (0.0 <= self.beta1 < 1.0 and 0.0 <= self.beta2 < 1.0):
            raise ModelConfigError("training.optimizer: beta1 and beta2 must lie in [0, 1)")
        if self.weight_decay < 0.0 or self.eps <= 0.0 or self.grad_clip_norm <= 0.0:
            raise ModelConfigError(
                "training.optimizer: weight_decay must be >= 0, eps and grad_clip_norm > 0"
            )


@dataclass(frozen=True)
class TrainingSettings:
    #: A named model, "<family>-<size>" (``gwtf.node.training.config.named_config``), e.g.
    #: "gpt-tiny".
    model: str = "gpt-tiny"
    #: Relay stages the model is split into (the data node holds embedding and head).
    stages: int = 2
    batch_size: int = 2
    seq_len: int = 32
    seed: int = 0
    #: Data node: iterations to train (0: until it is stopped), and microbatches injected per
    #: iteration.
    iterations: int = 0
    microbatches_per_iteration: int = 4
    #: Data node: a microbatch with no progress for this long is started again.
    stall_timeout_s: float = 30.0
    #: Data nodes sharing each iteration (each starts ``microbatches_per_iteration`` of its
    #: own), and this data node's shard among them, 0 .. data_nodes - 1.
    data_nodes: int = 1
    data_shard: int = 0
    #: A prepared data set (``gwtf-node data prepare``): its manifest.json or the folder holding
    #: it; the model's vocabulary is its tokenizer's. "" trains on the shipped Tiny Shakespeare
    #: text with the byte tokenizer.
    data: str = ""
    #: The run's vocabulary where ``training.data`` is not set (a relay holds no data set, yet
    #: its model must be the run's): the data set's tokenizer's, as ``data prepare`` prints it.
    #: 0: the data set's, or the byte tokenizer's (256) without one.
    vocab_size: int = 0
    #: Data node: evaluate the data set's validation windows every this many iterations (0:
    #: never), ``validation_windows`` of them.
    validation_every: int = 0
    validation_windows: int = 64
    #: A lone data node with a home writes a resume point there after every this many
    #: iterations (``gwtf.node.runtime.resume``; 0: never), and resumes from the newest on start.
    checkpoint_every: int = 1
    device: DeviceChoice = "auto"
    #: Master weights' dtype; float64 is for equivalence tests on CPU.
    param_dtype: ParamDtypeName = "float32"
    #: On CUDA, run forward under bf16 autocast (master weights stay in param_dtype).
    bf16_autocast: bool = True
    #: What activations and gradients travel between nodes as: "param" (param_dtype, exact) or
    #: "bfloat16" / "float16" (half the bytes; each part still computes in param_dtype). Part of
    #: the run: every node of a run sends the same.
    wire_dtype: WireDtypeName = "param"
    #: Microbatches a part may hold forward state for at once (its advertised capacity).
    max_in_flight: int = 64
    #: The most memory this node's part may take, in MiB (0: all the device's free memory on
    #: CUDA, the available RAM on CPU); a part that does not fit is refused at start-up
    #: (``gwtf.node.training.memory``).
    memory_limit_mib: int = 0
    codec_max_bytes: int = 256 * 1024 * 1024
    codec_max_ndim: int = 8
    optimizer: OptimizerSettings = field(default_factory=OptimizerSettings)

    def validate(self) -> None:
        family, _, size = self.model.partition("-")
        if not family or not size:
            raise ModelConfigError(
                f"training.model={self.model!r} must name a model as family-size, e.g. gpt-tiny"
            )
        for name in ("stages", "batch_size", "seq_len", "microbatches_per_iteration"):
            if getattr(self, name) < 1:
                raise ModelConfigError(f"training.{name}={getattr(self, name)} must be >= 1")
        if self.iterations < 0 or self.stall_timeout_s <= 0:
            raise ModelConfigError(
                "training.iterations must be >= 0 and training.stall_timeout_s > 0, got "
                f"{self.iterations} and {self.stall_timeout_s}"
            )
        if not 0 <= self.data_shard < self.data_nodes:
            raise ModelConfigError(
                f"training.data_shard={self.data_shard} must be within 0..data_nodes-1 "
                f"(data_nodes={self.data_nodes}): give each data node its own shard"
            )
        if self.vocab_size < 0:
            raise ModelConfigError(f"training.vocab_size={self.vocab_size} must be >= 0")
        if self.validation_every < 0 or self.validation_windows < 1:
            raise ModelConfigError(
                "training.validation_every must be >= 0 and training.validation_windows >= 1"
            )
        if self.checkpoint_every < 0:
            raise ModelConfigError(
                f"training.checkpoint_every={self.checkpoint_every} must be >= 0 (0: never)"
            )
        if self.validation_every and not self.data:
            raise ModelConfigError(
                "training.validation_every needs a prepared data set with a validation split: "
                "set training.data"
            )
        if self.device not in ("auto", "cuda", "cpu"):
            raise ModelConfigError(
                f"training.device={self.device!r} is not one of 'auto', 'cuda', 'cpu'"
            )
        if self.param_dtype not in PARAM_DTYPES:
            raise ModelConfigError(
                f"training.param_dtype={self.param_dtype!r} is not one of {sorted(PARAM_DTYPES)}"
            )
        if self.wire_dtype not in WIRE_DTYPES:
            raise ModelConfigError(
                f"training.wire_dtype={self.wire_dtype!r} is not one of {list(WIRE_DTYPES)}"
            )
        if self.max_in_flight < 1:
            raise ModelConfigError(f"training.max_in_flight={self.max_in_flight} must be >= 1")
        if self.memory_limit_mib < 0:
            raise ModelConfigError(
                f"training.memory_limit_mib={self.memory_limit_mib} must be >= 0 (0: no limit "
                "but the device's)"
            )
        if self.codec_max_bytes < 1 or not 1 <= self.codec_max_ndim <= 16:
            raise ModelConfigError(
                "training.codec_max_bytes must be >= 1 and codec_max_ndim within 1..16"
            )
        self.optimizer.validate()

    @property
    def torch_param_dtype(self) -> torch.dtype:
        import torch

        dtype: torch.dtype = getattr(torch, self.param_dtype)
        return dtype

    @property
    def torch_wire_dtype(self) -> torch.dtype:
        import torch

        name = self.param_dtype if self.wire_dtype == "param" else self.wire_dtype
        dtype: torch.dtype = getattr(torch, name)
        return dtype
