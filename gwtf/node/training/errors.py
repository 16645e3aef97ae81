"""The typed errors of the stage engine: what a caller (the node, a test) catches and handles.

Each message is one line for a person: what failed and what to do. The engine stays usable after
raising any of them: no half-applied state is left behind.
"""

from __future__ import annotations

from gwtf.errors import ConfigError, ProtocolError, TrainingError


class TensorCodecError(ProtocolError):
    """A tensor frame from a peer is malformed, oversized or not what was expected."""


class ActivationError(TrainingError):
    """An activation or gradient has the wrong shape, dtype or device for this part."""


class UnknownMicrobatchError(TrainingError):
    """A backward (or drop) names a microbatch this part holds no forward state for."""


class CheckpointError(TrainingError):
    """A checkpoint file is unreadable, tampered with (digest mismatch) or for another part."""


class ModelConfigError(ConfigError):
    """A model config, named size or partition request is invalid."""


class GradientShareError(TrainingError):
    """A replica's gradient share does not fit this part (names, shapes, counts)."""


class CapacityError(TrainingError):
    """A part already holds as many microbatches in flight as its capacity allows."""


class ExportError(TrainingError):
    """The parts gathered from a run do not make one model (steps differ, a layer is missing or
    held twice, a part is of another model), or the model has a feature the Hugging Face layout
    it is exported to cannot express."""
