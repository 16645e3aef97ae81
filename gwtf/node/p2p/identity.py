"""A node's libp2p identity: its secp256k1 node key, as libp2p sees it.

One key is the node: its Ethereum address is the node on chain, it signs hop receipts, and its
compressed public key is embedded in its libp2p peer id. So a peer's id alone tells which node
it is (``node_address_of_peer``), and the registry binds exactly that key, no other. The key
itself lives in the node's encrypted keystore (``gwtf.node.chain.wallet``).
"""

from __future__ import annotations

import os

from libp2p.crypto.keys import KeyPair, KeyType
from libp2p.crypto.secp256k1 import Secp256k1PrivateKey, Secp256k1PublicKey
from libp2p.peer.id import ID

from gwtf.contracts.encoding import node_address_of
from gwtf.errors import ProtocolError

_SECRET_BYTES = 32


def identity_from_key(private_key: bytes) -> KeyPair:
    """The libp2p key pair of a node key (32-byte secp256k1 secret)."""
    if len(private_key) != _SECRET_BYTES:
        raise ProtocolError(f"a node key is {_SECRET_BYTES} bytes, got {len(private_key)}")
    secret = Secp256k1PrivateKey.from_bytes(private_key)
    return KeyPair(secret, secret.get_public_key())


def new_identity() -> KeyPair:
    """A fresh random identity, for a node that needs none of its own on disk (tests, tools)."""
    return identity_from_key(os.urandom(_SECRET_BYTES))


def peer_id_of(key_pair: KeyPair) -> ID:
    """The libp2p peer id derived from a key pair."""
    return ID.from_pubkey(key_pair.public_key)


def public_key_of(key_pair: KeyPair) -> bytes:
    """The identity's uncompressed public key x ‖ y (64 bytes), as the registry takes it."""
    if key_pair.public_key.get_type() != KeyType.Secp256k1:
        raise ProtocolError("a node identity must be a secp256k1 key")
    assert isinstance(key_pair.public_key, Secp256k1PublicKey)
    return bytes(key_pair.public_key.impl.format(compressed=False))[1:]


def node_address_of_peer(peer_id: ID) -> str:
    """The on-chain node address behind a peer id: the Ethereum address of the secp256k1 key
    the id embeds. A peer whose id embeds another kind of key is no node, nor one that spells
    its key otherwise than its own connections do (``ID.from_pubkey``: the compressed key):
    one address, one peer id, so a peer id taken from a header names where to reach it."""
    public_key = peer_id.extract_public_key()  # None for an id that embeds no key
    if public_key is None or public_key.get_type() != KeyType.Secp256k1:
        raise ProtocolError(f"peer {peer_id} is not a secp256k1 identity, so not a GWTF node")
    if ID.from_pubkey(public_key) != peer_id:
        raise ProtocolError(f"peer id {peer_id} is not its key's own spelling")
    assert isinstance(public_key, Secp256k1PublicKey)
    return node_address_of(bytes(public_key.impl.format(compressed=False))[1:])
