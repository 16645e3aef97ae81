"""A part's state as one file: weights, AdamW state and step count, with a content digest.

Tensors go into a safetensors file (no pickle: loading a peer's file runs no code); a JSON-valued
header says which part of which model the file holds and carries the SHA-256 of everything else.
A joining replica loads a peer's file and is then bit-for-bit that peer.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load, save_file

from gwtf.node.training.config import ModelConfig, config_from_dict
from gwtf.node.training.errors import CheckpointError, ModelConfigError
from gwtf.node.training.model import DataPart, Stage, WholeModel
from gwtf.node.training.trainer import PartTrainer

FORMAT = "gwtf-part-state/1"
_STAGE_PART = re.compile(r"stage:[0-9]{1,6}-[0-9]{1,6}")


def part_identity(trainer: PartTrainer) -> str:
    """Which part a trainer holds: ``data``, ``whole`` or ``stage:<first>-<end>``."""
    module = trainer.module
    if isinstance(module, Stage):
        return f"stage:{module.first_layer}-{module.end_layer}"
    if isinstance(module, DataPart):
        return "data"
    if isinstance(module, WholeModel):
        return "whole"
    raise CheckpointError(f"cannot checkpoint a {type(module).__name__}")


def _config_json(trainer: PartTrainer) -> str:
    module = trainer.module
    if not isinstance(module, Stage | DataPart | WholeModel):
        raise CheckpointError(f"cannot checkpoint a {type(module).__name__}")
    return json.dumps(dataclasses.asdict(module.config), sort_keys=True)


def state_tensors(
    trainer: PartTrainer, weights_only: bool = False, copy: bool = True
) -> dict[str, torch.Tensor]:
    """Every tensor of the part's state (only its weights: ``weights_only``), on the host,
    under stable names; copies unless ``copy`` is False (then host tensors are the part's own,
    which change with its next step)."""

    def host(tensor: torch.Tensor) -> torch.Tensor:
        on_host = tensor.detach().to("cpu").contiguous()
        return on_host.clone() if copy else on_host

    tensors = {f"param/{name}": host(param) for name, param in trainer.named_params}
    if weights_only:
        return tensors
    by_param = {id(param): name for name, param in trainer.named_params}
    for param, state in trainer.optimizer.state.items():
        name = by_param[id(param)]
        for key, value in state.items():
            tensors[f"optim/{name}/{key}"] = host(value)
    return tensors


def content_digest(metadata: dict[str, str], tensors: dict[str, torch.Tensor]) -> str:
    """SHA-256 over the header fields and each tensor's name, dtype, shape and bytes."""
    hasher = hashlib.sha256(json.dumps(metadata, sort_keys=True).encode())
    for name in sorted(tensors):
        tensor = tensors[name].contiguous()
        hasher.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}".encode())
        hasher.update(tensor.reshape(-1).view(torch.uint8).numpy().data)
    return hasher.hexdigest()


def _metadata(trainer: PartTrainer) -> dict[str, str]:
    return {
        "format": FORMAT,
        "part": part_identity(trainer),
        "config": _config_json(trainer),
        "step": str(trainer.step_count),
    }


def part_metadata(trainer: PartTrainer) -> dict[str, str]:
    """The header fields a state file of the trainer's part at its step carries (no digest)."""
    return _metadata(trainer)


def state_digest(trainer: PartTrainer) -> str:
    """Digest of the part's current state: equal digests mean bit-identical replicas. It hashes
    the tensors where they lie (host tensors are not copied): call it where nothing steps the
    part meanwhile (its compute thread)."""
    return content_digest(_metadata(trainer), state_tensors(trainer, copy=False))


class DigestAtStep:
    """A part's state digest for readers that must not touch its tensors (a status written from
    the event loop): ``refresh`` computes it in the compute thread, serialised with the steps;
    ``current`` reads it. A digest is kept with the step and the weights' version it was taken
    at, so ``current`` is always the digest of the state at the part's present step, or None
    while that one is not computed yet."""

    def __init__(self, trainer: PartTrainer) -> None:
        self.trainer = trainer
        self.computed = 0  # how many digests it took
        self._kept: tuple[tuple[int, tuple[int, ...]], str] | None = None

    def _key(self) -> tuple[int, tuple[int, ...]]:
        return self.trainer.step_count, self.trainer.weights_version()

    def refresh(self) -> str | None:
        """Digest the present state unless that is done already (in the compute thread)."""
        key = self._key()
        if self._kept is None or self._kept[0] != key:
            digest = state_digest(self.trainer)
            self.computed += 1
            if self._key() != key:  # the step count moved meanwhile (on the event loop)
                return None
            self._kept = (key, digest)
        return self._kept[1]

    def current(self) -> str | None:
        """The digest of the state as it is now, if ``refresh`` took it; never computes."""
        kept = self._kept
        return kept[1] if kept is not None and kept[0] == self._key() else None


def holds_state_of(blob: bytes, trainer: PartTrainer, weights_only: bool = False) -> bool:
    """Whether a state file's bytes are the trainer's state as it is now, bit for bit, part and
    step included (its weights only: ``weights_only``, as ``save_part_state`` writes them);
    False for bytes that are no intact state file."""
    try:
        kept = verified_digest(blob)
    except CheckpointError:
        return False
    return kept == content_digest(_metadata(trainer), state_tensors(trainer, weights_only))


def save_part_state(trainer: PartTrainer, path: Path, weights_only: bool = False) -> str:
    """Write the part's state atomically to ``path``; returns its digest. ``weights_only``
    leaves out the optimizer's state (two thirds of the file with AdamW): what re-executing a
    hop needs, which loads as a state whose optimizer starts afresh."""
    temporary = path.with_name(path.name + ".partial")
    digest = snapshot_part_state(trainer, weights_only)(temporary)
    os.replace(temporary, path)
    return digest


def snapshot_part_state(trainer: PartTrainer, weights_only: bool = False) -> Callable[[Path], str]:
    """The part's state as it is now, copied to the host; returns ``write(path)``, which writes
    that copy as a state file (not atomically) and returns its digest. The copy is the only
    cost here: hashing and writing, the bulk of a save, can run later in another thread while
    the weights change."""
    tensors = state_tensors(trainer, weights_only)
    metadata = _metadata(trainer)

    def write(path: Path) -> str:
        digest = content_digest(metadata, tensors)
        save_file(tensors, str(path), metadata={**metadata, "digest": digest})
        return digest

    return write


def load_part_state(trainer: PartTrainer, path: Path) -> str:
    """Replace the trainer's weights, optimizer state and step with the file's; returns its
    digest. Nothing changes unless the file is intact and holds this very part."""
    metadata, tensors = read_checked(path)
    return apply_part_state(
        trainer, metadata, tensors, f"checkpoint {path}", "fetch the state of the same part"
    )


def apply_part_state(
    trainer: PartTrainer,
    metadata: dict[str, str],
    tensors: dict[str, torch.Tensor],
    source: str,
    remedy: str,
) -> str:
    """Load a verified state file's contents (``read_checked``) into the trainer; returns its
    digest. A file of another part or model is refused (``source`` names it in the error, and
    ``remedy`` says what to do) before anything changes."""
    expected = _metadata(trainer)
    for field in ("part", "config"):
        if metadata.get(field) != expected[field]:
            raise CheckpointError(
                f"{source} holds {field}={metadata.get(field)!r}, "
                f"but this replica serves {expected[field]!r}; {remedy}"
            )
    params = dict(trainer.named_params)
    if {f"param/{name}" for name in params} - set(tensors):
        raise CheckpointError(f"{source} lacks some parameters of this part; {remedy}")
    optimizer_state = _optimizer_state(trainer, tensors)
    with torch.no_grad():
        for name, param in params.items():
            param.copy_(tensors[f"param/{name}"])
    groups = trainer.optimizer.state_dict()["param_groups"]
    trainer.optimizer.load_state_dict({"state": optimizer_state, "param_groups": groups})
    trainer.discard_gradients()
    trainer.step_count = int(metadata["step"])
    return metadata["digest"]


def verified_digest(blob: bytes) -> str:
    """The content digest of a state file's bytes, checked against the one its header names:
    equal for bit-identical states whatever order the header's keys were written in (the bytes
    of two saves of one state differ)."""
    metadata, _ = _verified_contents(blob)
    return metadata["digest"]


@dataclasses.dataclass(frozen=True)
class PartState:
    """A part's state read from a state file's bytes (a peer's), its digest checked."""

    part: str  # "data", "whole" or "stage:<first>-<end>"
    config: ModelConfig
    step: int
    digest: str
    tensors: dict[str, torch.Tensor]

    @property
    def layers(self) -> range | None:
        """The blocks a stage's state holds (None for the data part)."""
        if not self.part.startswith("stage:"):
            return None
        first, _, end = self.part.removeprefix("stage:").partition("-")
        return range(int(first), int(end))


def read_part_state(blob: bytes) -> PartState:
    """Parse a state file's bytes: its digest, format, part, config and step are checked before
    anything in it is used, so a peer's malformed file is one ``CheckpointError``."""
    metadata, tensors = _verified_contents(blob)
    if metadata.get("format") != FORMAT:
        raise CheckpointError(f"a state file of format {metadata.get('format')!r}, not {FORMAT}")
    part, step = metadata.get("part", ""), metadata.get("step", "")
    if not (part in ("data", "whole") or _STAGE_PART.fullmatch(part)):
        raise CheckpointError(f"a state file of an unknown part {part[:40]!r}")
    if not step.isdigit():
        raise CheckpointError(f"a state file with a malformed step {step[:20]!r}")
    try:
        config = config_from_dict(json.loads(metadata.get("config", "")))
    except (ValueError, TypeError, AttributeError, RecursionError, ModelConfigError) as exc:
        raise CheckpointError(f"a state file whose model config is malformed: {exc}") from exc
    state = PartState(part, config, int(step), metadata["digest"], tensors)
    if state.layers is not None and not 0 <= state.layers.start < state.layers.stop:
        raise CheckpointError(f"a state file of an empty or reversed stage {part!r}")
    return state


def _verified_contents(blob: bytes) -> tuple[dict[str, str], dict[str, torch.Tensor]]:
    """A state file's header fields (with its digest) and tensors, once the content digest the
    header names is the content's."""
    try:
        header_bytes = int.from_bytes(blob[:8], "little")
        header = json.loads(blob[8 : 8 + header_bytes])
        tensors = load(blob)
    except (ValueError, RecursionError, SafetensorError) as exc:
        raise CheckpointError(f"not a state file: {exc}") from exc
    raw = header.get("__metadata__") if isinstance(header, dict) else None
    metadata = {str(k): str(v) for k, v in (raw or {}).items()}
    claimed = metadata.pop("digest", None)
    if claimed is None or content_digest(metadata, tensors) != claimed:
        raise CheckpointError("a state file whose content is not the digest its header names")
    return {**metadata, "digest": claimed}, tensors


_REFETCH = "fetch it again from another replica"


def read_checked(
    path: Path, remedy: str = _REFETCH
) -> tuple[dict[str, str], dict[str, torch.Tensor]]:
    """A state file's header fields (with its digest) and tensors, once its content is the
    digest its header names; a one-line ``CheckpointError`` naming the file and ending in
    ``remedy`` (what to do) otherwise."""
    try:
        with safe_open(str(path), framework="pt") as handle:
            metadata = dict(handle.metadata() or {})
            tensors = {key: handle.get_tensor(key) for key in handle.keys()}  # noqa: SIM118
    except (OSError, SafetensorError) as exc:
        raise CheckpointError(f"cannot read checkpoint {path}: {exc}; {remedy}") from exc
    if metadata.get("format") != FORMAT or "digest" not in metadata or "step" not in metadata:
        raise CheckpointError(f"{path} is not a {FORMAT} checkpoint; {remedy}")
    claimed = metadata.pop("digest")
    actual = content_digest(metadata, tensors)
    if actual != claimed:
        raise CheckpointError(
            f"checkpoint {path} digest mismatch (content {actual[:12]}, header {claimed[:12]}); "
            f"it is corrupt or tampered with: {remedy}"
        )
    if not metadata["step"].isdigit():
        raise CheckpointError(f"checkpoint {path} has a malformed step {metadata['step']!r}")
    return {**metadata, "digest": claimed}, tensors


def _optimizer_state(
    trainer: PartTrainer, tensors: dict[str, torch.Tensor]
) -> dict[int, dict[str, torch.Tensor]]:
    """The file's AdamW state keyed the way ``optimizer.load_state_dict`` numbers parameters."""
    state: dict[int, dict[str, torch.Tensor]] = {}
    shapes = dict(trainer.named_params)
    for index, name in enumerate(trainer.optimizer_names):
        prefix = f"optim/{name}/"
        entry = {
            key[len(prefix) :]: value for key, value in tensors.items() if key.startswith(prefix)
        }
        if not entry:
            continue
        for key in ("exp_avg", "exp_avg_sq"):
            if key in entry and entry[key].shape != shapes[name].shape:
                raise CheckpointError(f"checkpoint optimizer state {name}/{key} has a wrong shape")
        state[index] = entry
    return state
