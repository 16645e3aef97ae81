"""The devnet file: what `gwtf-node devnet` started, so that other commands can find it.

It records the JSON-RPC URL, the chain id, the deployed contract addresses and the funded
development accounts. The dev accounts' private keys are anvil's (or eth-tester's) well-known
test keys: they are printed and stored on purpose, and must never hold real value.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from gwtf.errors import ChainError

MAX_DEVNET_FILE_BYTES = 1024 * 1024


@dataclass(frozen=True)
class DevAccount:
    address: str
    #: 0x-hex key of a dev account (anvil's or eth-tester's public test keys), or "" for a
    #: chain reached with --rpc-url, which keeps its keys.
    private_key: str
    balance_wei: int


@dataclass(frozen=True)
class DevnetInfo:
    rpc_url: str
    chain_id: int
    contracts: dict[str, str]
    accounts: tuple[DevAccount, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "rpc_url": self.rpc_url,
            "chain_id": self.chain_id,
            "contracts": dict(self.contracts),
            "accounts": [asdict(a) for a in self.accounts],
        }

    @classmethod
    def from_json(cls, data: Any, source: str) -> DevnetInfo:
        try:
            return cls(
                rpc_url=str(data["rpc_url"]),
                chain_id=int(data["chain_id"]),
                contracts={str(k): str(v) for k, v in dict(data["contracts"]).items()},
                accounts=tuple(
                    DevAccount(str(a["address"]), str(a["private_key"]), int(a["balance_wei"]))
                    for a in data["accounts"]
                ),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ChainError(
                f"devnet file {source} is damaged ({exc!r}); restart `gwtf-node devnet`"
            ) from exc


def write_devnet_file(path: str | Path, info: DevnetInfo) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    # Written then renamed, so a reader never sees half a file.
    tmp.write_text(json.dumps(info.to_json(), indent=2))
    os.replace(tmp, path)
    return path


def read_devnet_file(path: str | Path) -> DevnetInfo:
    path = Path(path)
    if not path.is_file():
        raise ChainError(
            f"no devnet file at {path}; start `gwtf-node devnet` or pass --rpc-url and contracts"
        )
    try:
        if path.stat().st_size > MAX_DEVNET_FILE_BYTES:
            raise ChainError(f"devnet file {path} is too large; restart `gwtf-node devnet`")
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ChainError(f"devnet file {path} is unreadable; restart `gwtf-node devnet`") from exc
    return DevnetInfo.from_json(data, str(path))
