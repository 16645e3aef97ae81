"""The exported model on disk: ``config.json``, ``model.safetensors``, ``tokenizer.json`` and
``tokenizer_config.json`` as Hugging Face's ``from_pretrained`` reads them, a model card
(``README.md``), and ``gwtf-export.json`` saying where they came from."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from safetensors.torch import save_file

from gwtf.errors import ConfigError
from gwtf.node.training.hf_export import HfCheckpoint
from gwtf.node.training.tokenizer import RunTokenizer

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
PROVENANCE_FILE = "gwtf-export.json"
TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
CARD_FILE = "README.md"


def check_out_dir(out: Path) -> None:
    """Refuse, before anything is fetched, a directory the export would mix with other files."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} is a file; name a new or empty directory")
    if out.is_dir() and any(out.iterdir()):
        raise ConfigError(f"--out {out} exists and is not empty; name a new or empty directory")


def write_checkpoint(
    checkpoint: HfCheckpoint,
    out: Path,
    provenance: dict[str, Any],
    tokenizer: RunTokenizer | None = None,
    tokenizer_config: dict[str, Any] | None = None,
    card: str | None = None,
) -> list[Path]:
    """Write the checkpoint into ``out`` (created), with the tokenizer and the model card when
    given; each file appears whole or not at all."""
    check_out_dir(out)
    out.mkdir(parents=True, exist_ok=True)
    written = [_atomic(out / PROVENANCE_FILE, lambda p: p.write_text(_json(provenance)))]
    if card is not None:
        written.append(_atomic(out / CARD_FILE, lambda p: p.write_text(card, "utf-8")))
    if tokenizer is not None:
        text, config = tokenizer.json_text, tokenizer_config or {}
        written.append(_atomic(out / TOKENIZER_FILE, lambda p: p.write_text(text, "utf-8")))
        written.append(_atomic(out / TOKENIZER_CONFIG_FILE, lambda p: p.write_text(_json(config))))
    # The weights last: a directory with model.safetensors in it is a complete export.
    written.append(_atomic(out / CONFIG_FILE, lambda p: p.write_text(_json(checkpoint.config))))
    written.append(
        _atomic(
            out / WEIGHTS_FILE,
            lambda p: save_file(checkpoint.state_dict, str(p), metadata={"format": "pt"}),
        )
    )
    return written


def _json(value: dict[str, Any]) -> str:
    return json.dumps(value, indent=2, sort_keys=True) + "\n"


def _atomic(path: Path, write: Any) -> Path:
    partial = path.with_name(path.name + ".partial")
    write(partial)
    os.replace(partial, path)
    return path
