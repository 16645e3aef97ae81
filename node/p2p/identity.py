"""A node's libp2p identity: one Ed25519 key persisted per node, readable by its owner only."""

from __future__ import annotations

import os
from pathlib import Path

from libp2p.crypto.ed25519 import Ed25519PrivateKey, create_new_key_pair
from libp2p.crypto.keys import KeyPair
from libp2p.peer.id import ID

from gwtf.errors import ConfigError

_SEED_BYTES = 32


def load_or_create_identity(path: Path) -> KeyPair:
    """Return the key pair stored at ``path``, creating it (mode 0600) on first use.

    The file holds the 32-byte Ed25519 seed. A node keeps its peer id across restarts, which is
    what the on-chain binding of peer id to node refers to.
    """
    if path.exists():
        seed = path.read_bytes()
        if len(seed) != _SEED_BYTES:
            raise ConfigError(
                f"identity file {path} is corrupt ({len(seed)} bytes, expected {_SEED_BYTES}); "
                "restore it from a backup or delete it to get a new peer id"
            )
        private_key = Ed25519PrivateKey.from_bytes(seed)
        return KeyPair(private_key, private_key.get_public_key())
    path.parent.mkdir(parents=True, exist_ok=True)
    seed = os.urandom(_SEED_BYTES)
    # Write to a temporary name, then rename: a crash mid-write never leaves a torn key behind.
    tmp = path.with_suffix(path.suffix + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(seed)
    os.replace(tmp, path)
    return create_new_key_pair(seed)


def peer_id_of(key_pair: KeyPair) -> ID:
    """The libp2p peer id derived from a key pair."""
    return ID.from_pubkey(key_pair.public_key)
