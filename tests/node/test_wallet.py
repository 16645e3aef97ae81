"""Wallet and node keys: real encrypted keystores, one-line errors, passwords never echoed."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest
from eth_account import Account
from eth_account.messages import encode_defunct

from gwtf.errors import WalletError
from gwtf.node.chain.wallet import (
    create_wallet,
    import_key,
    load_or_create_node_key,
    node_key_path,
    open_wallet,
    read_keystore_address,
    resolve_password,
)

# Low scrypt cost keeps each test in milliseconds; the format is the same as production.
FAST = 2**4
PASSWORD = "correct horse battery"


def test_create_then_open_round_trips_and_is_private(tmp_path: Path) -> None:
    path = tmp_path / "w.json"
    created = create_wallet(path, PASSWORD, scrypt_n=FAST)
    opened = open_wallet(path, PASSWORD)
    assert opened.address == created.address == read_keystore_address(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    text = path.read_text()
    assert PASSWORD not in text
    assert created.key.hex() not in text
    # A standard keystore: eth-account itself can decrypt it.
    assert Account.decrypt(json.loads(text), PASSWORD) == created.key


def test_wrong_password_is_one_line_wallet_error(tmp_path: Path) -> None:
    path = tmp_path / "w.json"
    create_wallet(path, PASSWORD, scrypt_n=FAST)
    with pytest.raises(WalletError) as info:
        open_wallet(path, "not the password")
    message = str(info.value)
    assert message.startswith(f"wrong password for wallet {path}")
    assert "\n" not in message and "not the password" not in message


def test_missing_and_garbage_keystores(tmp_path: Path) -> None:
    with pytest.raises(WalletError, match=r"no wallet at .*gwtf-node wallet new"):
        open_wallet(tmp_path / "absent.json", PASSWORD)
    garbage = tmp_path / "garbage.json"
    garbage.write_text("{not json")
    with pytest.raises(WalletError, match="not a readable keystore"):
        open_wallet(garbage, PASSWORD)
    other_json = tmp_path / "other.json"
    other_json.write_text('{"hello": 1}')
    with pytest.raises(WalletError, match="not an Ethereum keystore"):
        open_wallet(other_json, PASSWORD)
    huge = tmp_path / "huge.json"
    huge.write_text(" " * 100_000)
    with pytest.raises(WalletError, match="too large"):
        open_wallet(huge, PASSWORD)


def test_create_refuses_to_overwrite_and_weak_passwords(tmp_path: Path) -> None:
    path = tmp_path / "w.json"
    create_wallet(path, PASSWORD, scrypt_n=FAST)
    before = path.read_text()
    with pytest.raises(WalletError, match="already exists"):
        create_wallet(path, PASSWORD, scrypt_n=FAST)
    assert path.read_text() == before
    with pytest.raises(WalletError, match="at least 8 characters"):
        create_wallet(tmp_path / "x.json", "short", scrypt_n=FAST)


def test_password_sources_in_order(tmp_path: Path) -> None:
    pw_file = tmp_path / "pw"
    pw_file.write_text("from-file\n")
    env = {"GWTF_WALLET_PASSWORD": "from-env"}
    assert resolve_password(pw_file, env=env) == "from-file"
    assert resolve_password(None, env=env) == "from-env"
    asked: list[str] = []

    def prompt(text: str) -> str:
        asked.append(text)
        return "typed"

    assert resolve_password(None, env={}, prompt=prompt, interactive=True) == "typed"
    assert asked == ["Wallet password: "]
    with pytest.raises(WalletError, match="pass --password-file PATH or set GWTF_WALLET_PASSWORD"):
        resolve_password(None, env={}, interactive=False)


def test_password_confirmation_and_bad_files(tmp_path: Path) -> None:
    answers = iter(["one-password", "another-one"])
    with pytest.raises(WalletError, match="passwords differ"):
        resolve_password(env={}, prompt=lambda _: next(answers), confirm=True, interactive=True)
    empty = tmp_path / "empty"
    empty.write_text("\n")
    with pytest.raises(WalletError, match="is empty"):
        resolve_password(empty, env={})
    with pytest.raises(WalletError, match="cannot read password file"):
        resolve_password(tmp_path / "absent", env={})


def test_import_key_keeps_the_address(tmp_path: Path) -> None:
    key = "0x" + "11" * 32
    account = import_key(tmp_path / "dev.json", key, PASSWORD, scrypt_n=FAST)
    assert account.address == Account.from_key(key).address
    assert open_wallet(tmp_path / "dev.json", PASSWORD).key == account.key
    with pytest.raises(WalletError, match="not a valid secp256k1 key"):
        import_key(tmp_path / "bad.json", "0x00", PASSWORD, scrypt_n=FAST)


def test_node_key_is_created_once_then_reused_and_signs(tmp_path: Path) -> None:
    wallet = tmp_path / "op.json"
    path = node_key_path(wallet, "gpu-0")
    assert path.parent == tmp_path and path != wallet
    first = load_or_create_node_key(path, PASSWORD, scrypt_n=FAST)
    second = load_or_create_node_key(path, PASSWORD, scrypt_n=FAST)
    assert first.address == second.address
    signed = second.sign_message(encode_defunct(text="hop"))
    assert Account.recover_message(encode_defunct(text="hop"), signature=signed.signature) == (
        first.address
    )
    with pytest.raises(WalletError, match="letters, digits"):
        node_key_path(wallet, "../evil")
