"""The Python mirror of the on-chain encoding: hop receipts, EIP-712 digests, tree leaves.

Owns the byte-exact rules that `HopReceipts.sol`, `WorkLedger.sol` and `NodeRegistry.sol` apply:
the ``HopReceipt`` struct (same field names as Solidity), the EIP-712 domains ("GWTF Ledger" v1
for receipts, "GWTF Registry" v1 for node bindings), receipt digests and signatures, and the
double-hashed leaf ``keccak256(keccak256(abi.encode(digest, index, unitsBefore,
keccak256(counterpartySignature))))`` that commits a receipt to its place in a node's epoch tree.
Pure: no chain, no clock. Golden vectors in ``tests/contracts/test_encoding.py`` pin every rule.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, fields
from typing import Final

from eth_abi.abi import encode
from eth_account import Account
from eth_hash.auto import keccak as keccak256
from eth_keys.datatypes import Signature
from eth_keys.exceptions import BadSignature
from eth_utils.address import to_checksum_address
from eth_utils.crypto import keccak
from eth_utils.exceptions import ValidationError

from gwtf.errors import ProtocolError

FORWARD: Final = 0
BACKWARD: Final = 1

LEDGER_DOMAIN_NAME: Final = "GWTF Ledger"
REGISTRY_DOMAIN_NAME: Final = "GWTF Registry"
DOMAIN_VERSION: Final = "1"

EIP712_DOMAIN_TYPE: Final = (
    "EIP712Domain(string name,string version,uint256 chainId,address verifyingContract)"
)
HOP_RECEIPT_TYPE: Final = (
    "HopReceipt(uint256 runId,uint64 epoch,uint64 iteration,uint64 microbatchId,uint16 stage,"
    "uint8 direction,uint16 attempt,address worker,address counterparty,bytes32 inputDigest,"
    "bytes32 outputDigest,uint64 units)"
)
NODE_BINDING_TYPE: Final = "NodeBinding(address wallet,bytes peerId,address node)"
HOP_RECEIPT_TYPE_HASH: Final = keccak(text=HOP_RECEIPT_TYPE)

# (solidity type, python field) in struct order; the EIP-712 type string above lists the same.
HOP_RECEIPT_ABI_TYPES: Final = (
    "uint256",
    "uint64",
    "uint64",
    "uint64",
    "uint16",
    "uint8",
    "uint16",
    "address",
    "address",
    "bytes32",
    "bytes32",
    "uint64",
)
SIGNATURE_BYTES: Final = 65
# secp256k1 order / 2: OpenZeppelin's ECDSA rejects signatures with a larger s (malleability).
SECP256K1_HALF_ORDER: Final = 0x7FFFFFFFFFFFFFFFFFFFFFFFFFFFFFFF5D576E7357A4501DDFE92F46681B20A0
MAX_UINT = {bits: (1 << bits) - 1 for bits in (8, 16, 64, 256)}


@dataclass(frozen=True)
class Eip712Domain:
    """An EIP-712 domain: binds a signature to one chain and one contract."""

    name: str
    version: str
    chain_id: int
    verifying_contract: str

    def separator(self) -> bytes:
        """The domain separator, as OpenZeppelin's EIP712 computes it."""
        return _domain_separator(self)


@functools.cache
def _domain_separator(domain: Eip712Domain) -> bytes:
    # Cached: a node hashes every receipt of an epoch under one domain.
    return keccak(
        encode(
            ["bytes32", "bytes32", "bytes32", "uint256", "address"],
            [
                keccak(text=EIP712_DOMAIN_TYPE),
                keccak(text=domain.name),
                keccak(text=domain.version),
                domain.chain_id,
                to_checksum_address(domain.verifying_contract),
            ],
        )
    )


def ledger_domain(chain_id: int, ledger_address: str) -> Eip712Domain:
    """The domain of hop receipts: the WorkLedger at ``ledger_address`` on ``chain_id``."""
    return Eip712Domain(LEDGER_DOMAIN_NAME, DOMAIN_VERSION, chain_id, ledger_address)


def registry_domain(chain_id: int, registry_address: str) -> Eip712Domain:
    """The domain of node bindings: the NodeRegistry at ``registry_address`` on ``chain_id``."""
    return Eip712Domain(REGISTRY_DOMAIN_NAME, DOMAIN_VERSION, chain_id, registry_address)


@dataclass(frozen=True)
class HopReceipt:
    """One stage's forward (direction 0) or backward (1) of one microbatch; mirrors Solidity."""

    # Field names are Solidity's (camelCase), so the mirror can be diffed against the contract.
    runId: int
    epoch: int
    iteration: int
    microbatchId: int
    stage: int
    direction: int
    attempt: int
    worker: str
    counterparty: str
    inputDigest: bytes
    outputDigest: bytes
    units: int

    def __post_init__(self) -> None:
        for field, abi_type in zip(fields(self), HOP_RECEIPT_ABI_TYPES, strict=True):
            value = getattr(self, field.name)
            if abi_type.startswith("uint"):
                _check_uint(field.name, value, int(abi_type[4:]))
            elif abi_type == "address":
                _check_address(field.name, value)
                # Canonical (checksummed) form, as web3 and recover_signer return addresses.
                object.__setattr__(self, field.name, to_checksum_address(value))
            else:
                _check_bytes32(field.name, value)
        if self.direction not in (FORWARD, BACKWARD):
            raise ProtocolError(
                f"receipt direction {self.direction} is neither 0 (forward) nor 1 (backward)"
            )

    def as_tuple(self) -> tuple[object, ...]:
        """The struct as an ABI tuple, in field order (what web3 passes to the contract)."""
        return tuple(getattr(self, field.name) for field in fields(self))


def _check_uint(name: str, value: object, bits: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_UINT[bits]:
        raise ProtocolError(f"receipt field {name}={value!r} is not a uint{bits}; fix the sender")


def _check_address(name: str, value: object) -> None:
    if not isinstance(value, str) or len(value) != 42 or not value.startswith("0x"):
        raise ProtocolError(f"receipt field {name}={value!r} is not a 0x-prefixed 20-byte address")
    try:
        bytes.fromhex(value[2:])
    except ValueError as exc:
        raise ProtocolError(f"receipt field {name}={value!r} is not hex") from exc


def _check_bytes32(name: str, value: object) -> None:
    if not isinstance(value, bytes) or len(value) != 32:
        raise ProtocolError(f"receipt field {name} must be exactly 32 bytes")


def scheduled_units(direction: int, units_per_hop: int) -> int:
    """Units a hop earns under a run's schedule: a backward costs twice a forward."""
    return units_per_hop if direction == FORWARD else 2 * units_per_hop


def hop_key(receipt: HopReceipt) -> bytes:
    """What makes a hop unique on chain; two leaves with one key are a double claim."""
    return keccak(
        encode(
            ["uint256", "uint64", "uint64", "uint16", "uint8", "uint16"],
            [
                receipt.runId,
                receipt.epoch,
                receipt.microbatchId,
                receipt.stage,
                receipt.direction,
                receipt.attempt,
            ],
        )
    )


def receipt_struct_hash(receipt: HopReceipt) -> bytes:
    """EIP-712 hashStruct(receipt).

    Every field of ``HopReceipt`` is a static ABI type, so ``abi.encode`` of the struct is the
    concatenation of one 32-byte word per field; packing the words directly is byte-identical to
    eth-abi's encoding (the golden vectors pin it) and several times faster, which matters to a node
    hashing 100,000 receipts of an epoch. The fields were range-checked when the receipt was built.
    """
    r = receipt
    return keccak256(
        b"".join(
            (
                HOP_RECEIPT_TYPE_HASH,
                _word(r.runId),
                _word(r.epoch),
                _word(r.iteration),
                _word(r.microbatchId),
                _word(r.stage),
                _word(r.direction),
                _word(r.attempt),
                _address_word(r.worker),
                _address_word(r.counterparty),
                r.inputDigest,
                r.outputDigest,
                _word(r.units),
            )
        )
    )


def _word(value: int) -> bytes:
    return value.to_bytes(32, "big")


def _address_word(address: str) -> bytes:
    return bytes(12) + bytes.fromhex(address[2:])


def typed_data_digest(domain: Eip712Domain, struct_hash: bytes) -> bytes:
    """keccak256("\\x19\\x01" ‖ domainSeparator ‖ structHash)."""
    return keccak256(b"\x19\x01" + domain.separator() + struct_hash)


def receipt_digest(receipt: HopReceipt, domain: Eip712Domain) -> bytes:
    """The digest worker and counterparty sign (binds chain id and ledger via the domain)."""
    return typed_data_digest(domain, receipt_struct_hash(receipt))


def binding_digest(wallet: str, peer_id: bytes, node: str, domain: Eip712Domain) -> bytes:
    """The digest a node key signs to bind itself to ``wallet`` and its libp2p ``peer_id``."""
    struct_hash = keccak(
        encode(
            ["bytes32", "address", "bytes32", "address"],
            [keccak(text=NODE_BINDING_TYPE), wallet, keccak(peer_id), node],
        )
    )
    return typed_data_digest(domain, struct_hash)


def sign_digest(digest: bytes, private_key: bytes) -> bytes:
    """A 65-byte r‖s‖v signature (v 27/28, low s) of a 32-byte digest."""
    if len(digest) != 32:
        raise ProtocolError("a digest to sign must be 32 bytes")
    signed = Account.unsafe_sign_hash(digest, private_key)
    return bytes(signed.signature)


def sign_receipt(receipt: HopReceipt, domain: Eip712Domain, private_key: bytes) -> bytes:
    """The EIP-712 signature of ``receipt`` under ``domain`` by ``private_key``."""
    return sign_digest(receipt_digest(receipt, domain), private_key)


def sign_binding(
    wallet: str, peer_id: bytes, node_private_key: bytes, domain: Eip712Domain
) -> bytes:
    """The node key's signature binding it to ``wallet`` and ``peer_id`` (for registerNode)."""
    node = Account.from_key(node_private_key).address
    return sign_digest(binding_digest(wallet, peer_id, node, domain), node_private_key)


def recover_digest_signer(digest: bytes, signature: bytes) -> str:
    """The checksummed address that signed ``digest``; rejects what OpenZeppelin's ECDSA rejects
    (wrong length, v not 27/28, s in the upper half), so a receipt accepted here verifies on chain.
    """
    if len(signature) != SIGNATURE_BYTES:
        raise ProtocolError(f"signature is {len(signature)} bytes, expected {SIGNATURE_BYTES}")
    r = int.from_bytes(signature[:32], "big")
    s = int.from_bytes(signature[32:64], "big")
    v = signature[64]
    if v not in (27, 28) or s > SECP256K1_HALF_ORDER or r == 0 or s == 0:
        raise ProtocolError("signature is malformed or malleable (v must be 27/28, s low)")
    try:
        public_key = Signature(vrs=(v - 27, r, s)).recover_public_key_from_msg_hash(digest)
    except (BadSignature, ValidationError) as exc:
        raise ProtocolError("signature does not recover to any public key") from exc
    return to_checksum_address(public_key.to_canonical_address())


def recover_signer(receipt: HopReceipt, domain: Eip712Domain, signature: bytes) -> str:
    """The address whose key signed ``receipt`` under ``domain``."""
    return recover_digest_signer(receipt_digest(receipt, domain), signature)


def receipt_leaf(
    receipt: HopReceipt,
    domain: Eip712Domain,
    index: int,
    units_before: int,
    counterparty_signature: bytes,
) -> bytes:
    """The leaf committing ``receipt`` to position ``index`` of a tree, with the prefix sum of
    units before it and its countersignature. Double-hashed like OpenZeppelin's StandardMerkleTree.
    """
    _check_uint("index", index, 64)
    _check_uint("unitsBefore", units_before, 64)
    inner = keccak256(
        receipt_digest(receipt, domain)
        + _word(index)
        + _word(units_before)
        + keccak256(counterparty_signature)
    )
    return keccak256(inner)


def claim_commitment(root: bytes, count: int, units: int) -> bytes:
    """What the ledger stores for a claim: keccak256(abi.encode(root, count, units))."""
    _check_bytes32("root", root)
    return keccak(encode(["bytes32", "uint64", "uint64"], [root, count, units]))


@dataclass(frozen=True)
class ClaimRef:
    """A node's claim for one epoch, as submitted (the ledger stores only its commitment)."""

    runId: int
    epoch: int
    node: str
    root: bytes
    count: int
    units: int

    def as_tuple(self) -> tuple[object, ...]:
        """The struct as an ABI tuple."""
        return (self.runId, self.epoch, self.node, self.root, self.count, self.units)

    def commitment(self) -> bytes:
        """What the ledger stores for this claim."""
        return claim_commitment(self.root, self.count, self.units)


@dataclass(frozen=True)
class LeafProof:
    """A receipt as committed in a node's tree, with its Merkle proof; mirrors Solidity."""

    receipt: HopReceipt
    index: int
    unitsBefore: int
    counterpartySignature: bytes
    proof: tuple[bytes, ...]

    def as_tuple(self) -> tuple[object, ...]:
        """The struct as an ABI tuple."""
        return (
            self.receipt.as_tuple(),
            self.index,
            self.unitsBefore,
            self.counterpartySignature,
            list(self.proof),
        )

    def leaf(self, domain: Eip712Domain) -> bytes:
        """This leaf's hash."""
        return receipt_leaf(
            self.receipt, domain, self.index, self.unitsBefore, self.counterpartySignature
        )
