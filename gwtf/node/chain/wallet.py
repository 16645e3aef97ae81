"""Keys on disk: the operator's wallet and each node's key.

Both are standard encrypted Ethereum keystores (eth-account / Web3 Secret Storage), so any
Ethereum tool can open the wallet. The password comes from ``--password-file``, else the
``GWTF_WALLET_PASSWORD`` environment variable, else an interactive prompt; it is never logged
and never written anywhere by this module.
"""

from __future__ import annotations

import getpass
import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from gwtf.errors import WalletError

if TYPE_CHECKING:  # eth_account loads when a key is made or opened, not to read an address
    from eth_account.signers.local import LocalAccount

ENV_WALLET_PASSWORD = "GWTF_WALLET_PASSWORD"
# A keystore is ~500 bytes; refusing big files bounds what we parse from disk.
MAX_KEYSTORE_BYTES = 64 * 1024
MAX_PASSWORD_BYTES = 4096
MIN_NEW_PASSWORD_CHARS = 8


class Prompt(Protocol):
    """Ask the person at the terminal for a secret (the question shown), without echoing it;
    blocks until they answer. Raises ``EOFError`` or ``KeyboardInterrupt`` when they do not."""

    def __call__(self, question: str, /) -> str: ...


def resolve_password(
    password_file: str | Path | None = None,
    env: Mapping[str, str] | None = None,
    prompt: Prompt | None = None,
    *,
    confirm: bool = False,
    interactive: bool | None = None,
) -> str:
    """Find the keystore password: a password file, else $GWTF_WALLET_PASSWORD, else a prompt."""
    env = os.environ if env is None else env
    if password_file is not None:
        return _read_password_file(Path(password_file))
    if env.get(ENV_WALLET_PASSWORD):
        return env[ENV_WALLET_PASSWORD]
    if interactive is None:
        interactive = sys.stdin.isatty()
    if not interactive:
        raise WalletError(
            f"no wallet password given; pass --password-file PATH or set {ENV_WALLET_PASSWORD}"
        )
    ask = prompt or getpass.getpass
    password = ask("Wallet password: ")
    if confirm and ask("Repeat password: ") != password:
        raise WalletError("the two passwords differ; run the command again")
    return password


def _read_password_file(path: Path) -> str:
    try:
        if path.stat().st_size > MAX_PASSWORD_BYTES:
            raise WalletError(
                f"password file {path} is over {MAX_PASSWORD_BYTES} bytes; is it right?"
            )
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise WalletError(f"cannot read password file {path} ({exc.strerror})") from exc
    except UnicodeDecodeError as exc:
        raise WalletError(f"password file {path} is not UTF-8 text") from exc
    # Editors add a final newline; a password never ends with one.
    password = text.rstrip("\r\n")
    if not password:
        raise WalletError(f"password file {path} is empty; write the password into it")
    return password


def _write_keystore(path: Path, keystore: dict[str, Any]) -> None:
    if path.exists():
        raise WalletError(f"{path} already exists; choose another path or delete it first")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # Created 0600 from the start so the encrypted key is never world-readable.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(keystore, fh)
    except OSError as exc:
        raise WalletError(f"cannot write keystore {path} ({exc.strerror})") from exc


def _encrypt(account: LocalAccount, password: str, scrypt_n: int | None) -> dict[str, Any]:
    from eth_account import Account

    return Account.encrypt(account.key, password, kdf="scrypt", iterations=scrypt_n)


def create_wallet(path: str | Path, password: str, *, scrypt_n: int | None = None) -> LocalAccount:
    """Create a new wallet keystore at ``path`` (never overwriting) and return its account.

    ``scrypt_n`` lowers the key-derivation cost; only tests should pass it.
    """
    from eth_account import Account

    if len(password) < MIN_NEW_PASSWORD_CHARS:
        raise WalletError(f"choose a password of at least {MIN_NEW_PASSWORD_CHARS} characters")
    account: LocalAccount = Account.create()
    _write_keystore(Path(path), _encrypt(account, password, scrypt_n))
    return account


def import_key(
    path: str | Path, private_key: bytes | str, password: str, *, scrypt_n: int | None = None
) -> LocalAccount:
    """Write an existing private key (e.g. a devnet account) to an encrypted keystore."""
    from eth_account import Account

    try:
        account: LocalAccount = Account.from_key(private_key)
    except (ValueError, TypeError) as exc:
        raise WalletError("the private key to import is not a valid secp256k1 key") from exc
    _write_keystore(Path(path), _encrypt(account, password, scrypt_n))
    return account


def read_keystore_address(path: str | Path) -> str:
    """The checksummed address stored in a keystore, without asking for the password."""
    from eth_utils.address import to_checksum_address

    return str(to_checksum_address(keystore_address(path)))


def keystore_address(path: str | Path) -> str:
    """The address stored in a keystore as 0x and 40 lowercase hex digits (no checksum, so
    nothing of eth_utils loads: what a command compares with what a node says of itself)."""
    keystore = _load_keystore_json(Path(path))
    address = keystore.get("address")
    digits = address.removeprefix("0x").lower() if isinstance(address, str) else ""
    if len(digits) != 40 or any(c not in "0123456789abcdef" for c in digits):
        raise WalletError(f"{path} has no valid address field; is it an Ethereum keystore?")
    return "0x" + digits


def _load_keystore_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise WalletError(
            f"no wallet at {path}; create one with `gwtf-node wallet new --wallet {path}`"
        )
    try:
        if path.stat().st_size > MAX_KEYSTORE_BYTES:
            raise WalletError(f"{path} is too large to be a keystore; check the path")
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise WalletError(f"{path} is not a readable keystore JSON file; check the path") from exc
    if not isinstance(data, dict) or ("crypto" not in data and "Crypto" not in data):
        raise WalletError(f"{path} is not an Ethereum keystore (no crypto section)")
    return data


def open_wallet(path: str | Path, password: str) -> LocalAccount:
    """Decrypt the keystore at ``path``; a wrong password is a one-line ``WalletError``."""
    from eth_account import Account

    keystore = _load_keystore_json(Path(path))
    try:
        key = Account.decrypt(keystore, password)
    except ValueError as exc:
        # eth-keyfile raises ValueError("MAC mismatch") for a wrong password.
        raise WalletError(
            f"wrong password for wallet {path}; check --password-file or {ENV_WALLET_PASSWORD}"
        ) from exc
    except (KeyError, TypeError, NotImplementedError) as exc:
        raise WalletError(f"{path} is a damaged or unsupported keystore") from exc
    account: LocalAccount = Account.from_key(key)
    return account


def node_key_path(wallet_path: str | Path, node_name: str) -> Path:
    """Where the key of node ``node_name`` lives: next to the wallet that owns it."""
    if not node_name or not all(c.isalnum() or c in "-_" for c in node_name):
        raise WalletError(f"node name {node_name!r} must be letters, digits, '-' or '_'")
    wallet = Path(wallet_path)
    return wallet.with_name(f"{wallet.stem}.node-{node_name}.json")


def load_or_create_node_key(
    path: str | Path, password: str, *, scrypt_n: int | None = None
) -> LocalAccount:
    """The node's secp256k1 key: opened if it exists, else created and saved.

    The node key is the node: its address is the node on chain, it is its libp2p identity, and
    it signs hop receipts (EIP-712) all day. It is separate from the wallet that holds stake and
    rewards, so a node key that leaks never exposes the funds (though its stake can be slashed
    by whoever signs two receipts for one hop with it).
    """
    from eth_account import Account

    path = Path(path)
    if path.exists():
        return open_wallet(path, password)
    account: LocalAccount = Account.create()
    _write_keystore(path, _encrypt(account, password, scrypt_n))
    return account
