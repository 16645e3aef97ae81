"""The Python mirror of the on-chain encoding: hop receipts, certificate leaves, node bindings.

Owns the byte-exact rules that `HopReceipts.sol`, `WorkLedger.sol`, `Disputes.sol` and
`NodeRegistry.sol` apply: the ``HopReceipt`` struct (same field names as Solidity), the EIP-712
domains ("GWTF Ledger" v1 for receipts, "GWTF Registry" v1 for node bindings), receipt digests,
hop keys, the ``HopBatch`` a worker signs and its counterparty countersigns (a Merkle root over
receipt digests; a receipt is signed as a leaf of a batch, a batch of one by default), the
``CertifiedHop`` leaf of a data node's certificate tree (an
OpenZeppelin StandardMerkleTree leaf), and a node's identity: one secp256k1 key whose address is
the node on chain and whose compressed public key is its libp2p peer id.
Pure: no chain, no clock. Golden vectors in ``tests/contracts/test_encoding.py`` pin every rule.
"""

from __future__ import annotations

import functools
import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Annotated, Final, get_type_hints

import coincurve
from eth_abi.abi import encode
from eth_utils.address import to_checksum_address

from gwtf.contracts.keccak import keccak256
from gwtf.contracts.merkle import process_proof
from gwtf.errors import ProtocolError

FORWARD: Final = 0
BACKWARD: Final = 1

LEDGER_DOMAIN_NAME: Final = "GWTF Ledger"
REGISTRY_DOMAIN_NAME: Final = "GWTF Registry"
DOMAIN_VERSION: Final = "1"

EIP712_DOMAIN_TYPE: Final = (
    "EIP712Domain(string name,string version,uint256 chainId,address verifyingContract)"
)
NODE_BINDING_TYPE: Final = "NodeBinding(address wallet,address node)"

# The certificate tree's leaf values, as OpenZeppelin's StandardMerkleTree is given them.
CERTIFIED_HOP_ABI_TYPES: Final = (
    "uint64",
    "uint64",
    "address",
    "uint64",
    "bytes32",
    "bytes32",
    "bytes32",
)
SIGNATURE_BYTES: Final = 65
PUBLIC_KEY_BYTES: Final = 64
# A libp2p peer id of a secp256k1 key: identity multihash of the protobuf PublicKey
# {Type: Secp256k1, Data: the 33-byte compressed key}.
PEER_ID_PREFIX: Final = bytes.fromhex("002508021221")
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
    # Cached: a data node hashes every receipt of an epoch under one domain.
    return keccak256(
        encode(
            ["bytes32", "bytes32", "bytes32", "uint256", "address"],
            [
                keccak256(EIP712_DOMAIN_TYPE.encode()),
                keccak256(domain.name.encode()),
                keccak256(domain.version.encode()),
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


# The Solidity types of struct fields, as Python annotations: a field's type names its
# Solidity type (``HOP_RECEIPT_FIELDS`` reads them back).
Uint256 = Annotated[int, "uint256"]
Uint64 = Annotated[int, "uint64"]
Uint16 = Annotated[int, "uint16"]
Uint8 = Annotated[int, "uint8"]
Address = Annotated[str, "address"]
Bytes32 = Annotated[bytes, "bytes32"]


@dataclass(frozen=True)
class HopReceipt:
    """One relay stage's forward (direction 0) or backward (1) of one microbatch; mirrors
    Solidity. ``dataNode`` is the data node whose microbatch it is and which certifies it."""

    # Field names and types are Solidity's (camelCase names), in struct order, so the mirror
    # can be diffed against the contract (a test compares them with the compiled ABI).
    runId: Uint256
    epoch: Uint64
    dataNode: Address
    iteration: Uint64
    microbatchId: Uint64
    stage: Uint16
    direction: Uint8
    attempt: Uint16
    worker: Address
    counterparty: Address
    inputDigest: Bytes32
    outputDigest: Bytes32
    units: Uint64

    def __post_init__(self) -> None:
        for name, kind, bits in _HOP_RECEIPT_FIELDS:
            value = getattr(self, name)
            if kind == "uint":
                check_uint(name, value, bits)
            elif kind == "address":
                # Canonical (checksummed) form, as web3 and recover_signer return addresses.
                object.__setattr__(self, name, checked_address(name, value))
            else:
                check_bytes32(name, value)
        if self.direction not in (FORWARD, BACKWARD):
            raise ProtocolError(
                f"receipt direction {self.direction} is neither 0 (forward) nor 1 (backward)"
            )

    def as_tuple(self) -> tuple[object, ...]:
        """The struct as an ABI tuple, in field order (what web3 passes to the contract)."""
        return tuple(getattr(self, field.name) for field in fields(self))

    # The two hashes of a receipt are computed once per receipt object and kept on it (the
    # receipt cannot change): a node hashes one receipt for each signature it makes or checks,
    # its leaf and its key, and an auditor for its leaf's check, both recoveries and the
    # equivocation search.

    @functools.cached_property
    def hop_key(self) -> bytes:
        """``hop_key(self)``."""
        tail = _HOP_KEY_TAIL.pack(
            self.epoch, _address_bytes(self.dataNode), self.microbatchId, self.stage,
            self.direction, self.attempt, _address_bytes(self.worker),
        )  # fmt: skip
        return keccak256(_word(self.runId) + tail)

    @functools.cached_property
    def struct_hash(self) -> bytes:
        """EIP-712 hashStruct of the receipt.

        Every field is a static ABI type, so ``abi.encode`` of the struct is the concatenation
        of one 32-byte word per field; packing the words directly is byte-identical to
        eth-abi's encoding (the golden vectors pin it) and several times faster, which matters
        to a data node hashing 100,000 receipts of an epoch. The fields were range-checked
        when the receipt was built."""
        tail = _STRUCT_TAIL.pack(
            self.epoch, _address_bytes(self.dataNode), self.iteration, self.microbatchId,
            self.stage, self.direction, self.attempt, _address_bytes(self.worker),
            _address_bytes(self.counterparty), self.inputDigest, self.outputDigest, self.units,
        )  # fmt: skip
        return keccak256(HOP_RECEIPT_TYPE_HASH + _word(self.runId) + tail)


#: (field name, Solidity type) of each ``HopReceipt`` field, in struct order: the one list of a
#: hop's fields, which the node's tables, its wire format and its API are derived from.
HOP_RECEIPT_FIELDS: Final = tuple(
    (name, str(hint.__metadata__[0]))
    for name, hint in get_type_hints(HopReceipt, include_extras=True).items()
)
HOP_RECEIPT_ABI_TYPES: Final = tuple(abi for _, abi in HOP_RECEIPT_FIELDS)

#: The EIP-712 type of a receipt, as ``HopReceipts.sol`` spells it: "HopReceipt(uint256 runId,...)".
HOP_RECEIPT_TYPE: Final = (
    "HopReceipt(" + ",".join(f"{abi} {name}" for name, abi in HOP_RECEIPT_FIELDS) + ")"
)
HOP_RECEIPT_TYPE_HASH: Final = keccak256(HOP_RECEIPT_TYPE.encode())

# (field name, "uint" | "address" | "bytes32", bits) in struct order: what each field must be.
_HOP_RECEIPT_FIELDS: Final = tuple(
    (name, abi[:4] if abi.startswith("uint") else abi, int(abi[4:]) if abi[:4] == "uint" else 0)
    for name, abi in HOP_RECEIPT_FIELDS
)


def snake_case(field_name: str) -> str:
    """A Solidity field name as Python and SQL spell it: ``microbatchId`` → ``microbatch_id``."""
    return re.sub(r"([A-Z])", r"_\1", field_name).lower()


def check_uint(name: str, value: object, bits: int) -> None:
    """A ``ProtocolError`` unless ``value`` is an int that fits a uint of ``bits``."""
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_UINT[bits]:
        raise ProtocolError(f"field {name}={value!r} is not a uint{bits}; fix the sender")


def checked_address(name: str, value: object) -> str:
    """``value`` as a checksummed address, or a ``ProtocolError``."""
    if not isinstance(value, str):
        raise ProtocolError(f"field {name}={value!r} is not a 0x-prefixed 20-byte address")
    canonical = _canonical_address(value)
    if canonical is None:
        raise ProtocolError(f"field {name}={value!r} is not a 0x-prefixed 20-byte hex address")
    return canonical


@functools.lru_cache(maxsize=4096)
def _canonical_address(value: str) -> str | None:
    # Cached: an epoch's receipts name a few nodes many times, and each checksum is a keccak.
    if len(value) != 42 or not value.startswith("0x"):
        return None
    try:
        bytes.fromhex(value[2:])
    except ValueError:
        return None
    return to_checksum_address(value)


def _checksummed(address: str) -> str:
    canonical = _canonical_address(address)
    assert canonical is not None, "only called with addresses built here"
    return canonical


def check_bytes32(name: str, value: object) -> None:
    """A ``ProtocolError`` unless ``value`` is exactly 32 bytes."""
    if not isinstance(value, bytes) or len(value) != 32:
        raise ProtocolError(f"field {name} must be exactly 32 bytes")


def scheduled_units(direction: int, units_per_hop: int) -> int:
    """Units a hop earns under a run's schedule: a backward costs twice a forward."""
    return units_per_hop if direction == FORWARD else 2 * units_per_hop


def _word(value: int) -> bytes:
    return value.to_bytes(32, "big")


def _address_word(address: str) -> bytes:
    return bytes(12) + _address_bytes(address)


@functools.lru_cache(maxsize=4096)
def _address_bytes(address: str) -> bytes:
    return bytes.fromhex(address[2:])


# The ABI words after the run id, packed at once: a uint64 is 24 zero bytes and 8, an address
# 12 and 20 (what abi.encode writes for them).
_HOP_KEY_TAIL: Final = struct.Struct(">24xQ12x20s24xQ24xQ24xQ24xQ12x20s")
_STRUCT_TAIL: Final = struct.Struct(">24xQ12x20s24xQ24xQ24xQ24xQ24xQ12x20s12x20s32s32s24xQ")
_LEAF_WORDS: Final = struct.Struct(">24xQ24xQ12x20s24xQ32s32s32s")
_RANGE_WORDS: Final = struct.Struct(">12x20s24xQ24xQ24xQ32s")


def hop_key(receipt: HopReceipt) -> bytes:
    """What makes a hop unique: one worker's try at one stage and direction of one microbatch
    of one data node. Two receipts with one key and different contents conflict."""
    return receipt.hop_key


def receipt_struct_hash(receipt: HopReceipt) -> bytes:
    """EIP-712 hashStruct(receipt)."""
    return receipt.struct_hash


def typed_data_digest(domain: Eip712Domain, struct_hash: bytes) -> bytes:
    """keccak256("\\x19\\x01" ‖ domainSeparator ‖ structHash)."""
    return keccak256(b"\x19\x01" + domain.separator() + struct_hash)


def receipt_digest(receipt: HopReceipt, domain: Eip712Domain) -> bytes:
    """The digest worker and counterparty sign (binds chain id and ledger via the domain)."""
    return typed_data_digest(domain, receipt_struct_hash(receipt))


def sign_digest(digest: bytes, private_key: bytes) -> bytes:
    """A 65-byte r‖s‖v signature (v 27/28, low s) of a 32-byte digest.

    libsecp256k1 (through coincurve) signs deterministically (RFC 6979) and always with a low s,
    so the bytes are those eth-account makes, about eight times faster: a relay signs and
    countersigns a receipt for every hop."""
    if len(digest) != 32:
        raise ProtocolError("a digest to sign must be 32 bytes")
    signature = _signing_key(private_key).sign_recoverable(digest, hasher=None)
    return signature[:64] + bytes([27 + signature[64]])


@functools.lru_cache(maxsize=16)
def _signing_key(private_key: bytes) -> coincurve.PrivateKey:
    # Cached: building the key derives its public key, which costs more than a signature, and a
    # node signs with its one key all day.
    return coincurve.PrivateKey(private_key)


def sign_receipt(
    receipt: HopReceipt, domain: Eip712Domain, private_key: bytes, proof: Sequence[bytes] = ()
) -> bytes:
    """``private_key``'s signature of the batch that holds ``receipt`` by ``proof`` (a batch of
    one, the receipt alone, by default): ``signing_digest``."""
    return sign_digest(signing_digest(receipt, domain, proof), private_key)


def recover_digest_signer(digest: bytes, signature: bytes) -> str:
    """The checksummed address that signed ``digest``; rejects what OpenZeppelin's ECDSA rejects
    (wrong length, v not 27/28, s in the upper half), so a signature accepted here verifies on
    chain."""
    if len(signature) != SIGNATURE_BYTES:
        raise ProtocolError(f"signature is {len(signature)} bytes, expected {SIGNATURE_BYTES}")
    v = signature[64]
    s = signature[32:64]
    # Big-endian words of equal length compare as the numbers they hold.
    if v not in (27, 28) or s > _HALF_ORDER_WORD or s == _ZERO_WORD or signature[:32] == _ZERO_WORD:
        raise ProtocolError("signature is malformed or malleable (v must be 27/28, s low)")
    if len(digest) != 32:
        raise ProtocolError("a signed digest must be 32 bytes")
    try:
        public_key = coincurve.PublicKey.from_signature_and_message(
            signature[:64] + _RECOVERY_ID[v], digest, hasher=None
        )
    except ValueError as exc:  # coincurve: no key recovers from these r, s
        raise ProtocolError("signature does not recover to any public key") from exc
    return _address_of_key(public_key.format(compressed=False))


_HALF_ORDER_WORD: Final = SECP256K1_HALF_ORDER.to_bytes(32, "big")
_ZERO_WORD: Final = bytes(32)
_RECOVERY_ID: Final = {27: b"\x00", 28: b"\x01"}


@functools.lru_cache(maxsize=4096)
def _address_of_key(uncompressed: bytes) -> str:
    # Cached: an epoch's signatures come from a few keys, and the address is a keccak and a
    # checksum (another keccak) of the key.
    return node_address_of(uncompressed[1:])


def recover_signer(
    receipt: HopReceipt, domain: Eip712Domain, signature: bytes, proof: Sequence[bytes] = ()
) -> str:
    """The address whose key signed the batch that holds ``receipt`` by ``proof``."""
    return recover_digest_signer(signing_digest(receipt, domain, proof), signature)


# ---------------------------------------------------------------- batches


@dataclass(frozen=True)
class HopBatch:
    """What a worker signs and its counterparty countersigns: the Merkle root of the digests of
    receipts of one run and epoch in which the one worked for the other; mirrors Solidity.

    The root is OpenZeppelin's sorted-pair tree (``gwtf.contracts.merkle``) over receipt
    digests: a receipt is in the batch exactly when its digest and its proof lead to the root,
    so the contract rebuilds the batch from a receipt and its proof and needs no other field.
    The ledger's domain binds chain and contract; run, epoch and the two parties bind the rest,
    and each is a receipt's own field, so a batch cannot be read in another run, epoch or role.
    """

    runId: Uint256
    epoch: Uint64
    worker: Address
    counterparty: Address
    root: Bytes32

    def __post_init__(self) -> None:
        check_uint("runId", self.runId, 256)
        check_uint("epoch", self.epoch, 64)
        object.__setattr__(self, "worker", checked_address("worker", self.worker))
        object.__setattr__(self, "counterparty", checked_address("counterparty", self.counterparty))
        check_bytes32("root", self.root)

    @classmethod
    def of(cls, receipt: HopReceipt, root: bytes) -> HopBatch:
        """The batch of ``receipt``'s run, epoch and parties with ``root``."""
        return cls(receipt.runId, receipt.epoch, receipt.worker, receipt.counterparty, root)

    def struct_hash(self) -> bytes:
        """EIP-712 hashStruct of the batch (every field static: one word each)."""
        return keccak256(
            HOP_BATCH_TYPE_HASH + _word(self.runId) + _word(self.epoch)
            + _address_word(self.worker) + _address_word(self.counterparty) + self.root
        )  # fmt: skip

    def digest(self, domain: Eip712Domain) -> bytes:
        """The digest worker and counterparty sign."""
        return typed_data_digest(domain, self.struct_hash())


#: The EIP-712 type of a batch, as ``HopReceipts.sol`` spells it.
HOP_BATCH_TYPE: Final = (
    "HopBatch(uint256 runId,uint64 epoch,address worker,address counterparty,bytes32 root)"
)
HOP_BATCH_TYPE_HASH: Final = keccak256(HOP_BATCH_TYPE.encode())


def batch_root(digest: bytes, proof: Sequence[bytes]) -> bytes:
    """The root of the batch that holds the receipt of ``digest`` by ``proof`` (the digest
    itself for a batch of one, whose proof is empty)."""
    return process_proof(proof, digest)


def signing_digest(
    receipt: HopReceipt,
    domain: Eip712Domain,
    proof: Sequence[bytes] = (),
    digest: bytes | None = None,
) -> bytes:
    """What both parties of ``receipt`` sign for it: the digest of the batch that holds it by
    ``proof`` (``digest``: its receipt digest, when computed already). ``HopBatch.of(receipt,
    root).digest(domain)``, packed directly from the receipt's checked fields: a node computes
    it for every signature it makes or checks, an auditor for every one it recovers."""
    leaf = receipt_digest(receipt, domain) if digest is None else digest
    root = process_proof(proof, leaf) if proof else leaf
    struct_hash = keccak256(
        HOP_BATCH_TYPE_HASH + _word(receipt.runId) + _word(receipt.epoch)
        + _address_word(receipt.worker) + _address_word(receipt.counterparty) + root
    )  # fmt: skip
    return typed_data_digest(domain, struct_hash)


def signatures_hash(
    worker_signature: bytes, counterparty_signature: bytes, proof: Sequence[bytes] = ()
) -> bytes:
    """What a certificate leaf commits of how its receipt is signed, its batch seal:
    keccak256(abi.encode(proof, workerSignature, counterpartySignature)), the proof of the
    receipt in its batch and the two signatures of the batch, packed directly (a data node
    hashes every receipt of an epoch)."""
    if not proof and len(worker_signature) == len(counterparty_signature) == SIGNATURE_BYTES:
        # The usual case, a batch of one: constant offsets and padding, written once.
        return keccak256(
            _EMPTY_SEAL_HEAD + worker_signature + _SIGNATURE_PAD + _SIGNATURE_LENGTH
            + counterparty_signature + _SIGNATURE_PAD
        )  # fmt: skip

    def tail(value: bytes) -> bytes:  # a dynamic ``bytes``: its length, then padded data
        return _word(len(value)) + value + bytes(-len(value) % 32)

    path = _word(len(proof)) + b"".join(proof)
    first = tail(worker_signature)
    head = _word(96) + _word(96 + len(path)) + _word(96 + len(path) + len(first))
    return keccak256(head + path + first + tail(counterparty_signature))


# abi.encode(bytes32[], bytes, bytes) of an empty proof and two 65-byte signatures: offsets 96,
# 128 and 256, the proof's length 0, then each signature as its length (65) and its data padded
# to 96 bytes.
_SIGNATURE_LENGTH: Final = _word(SIGNATURE_BYTES)
_SIGNATURE_PAD: Final = bytes(-SIGNATURE_BYTES % 32)
_EMPTY_SEAL_HEAD: Final = (
    _word(96) + _word(128) + _word(128 + 32 + 96) + _word(0) + _SIGNATURE_LENGTH
)


# ---------------------------------------------------------------- node identity


def node_public_key(private_key: bytes) -> bytes:
    """The uncompressed secp256k1 public key x ‖ y (64 bytes) of a node key."""
    return bytes(coincurve.PrivateKey(private_key).public_key.format(compressed=False)[1:])


def node_address_of(public_key: bytes) -> str:
    """The node's address: the last 20 bytes of keccak256 of its public key x ‖ y."""
    if len(public_key) != PUBLIC_KEY_BYTES:
        raise ProtocolError(f"a public key is {PUBLIC_KEY_BYTES} bytes, got {len(public_key)}")
    return _checksummed("0x" + keccak256(public_key)[12:].hex())


def compressed_public_key(public_key: bytes) -> bytes:
    """The 33-byte compressed form (0x02 or 0x03 by the parity of y, then x)."""
    if len(public_key) != PUBLIC_KEY_BYTES:
        raise ProtocolError(f"a public key is {PUBLIC_KEY_BYTES} bytes, got {len(public_key)}")
    return bytes([2 + public_key[63] % 2]) + public_key[:32]


def peer_id_of_public_key(public_key: bytes) -> bytes:
    """The libp2p peer id (39 bytes) of a secp256k1 public key, as NodeRegistry derives it."""
    return PEER_ID_PREFIX + compressed_public_key(public_key)


def binding_digest(wallet: str, node: str, domain: Eip712Domain) -> bytes:
    """The digest a node key signs to bind itself to ``wallet``."""
    struct_hash = keccak256(
        encode(
            ["bytes32", "address", "address"],
            [keccak256(NODE_BINDING_TYPE.encode()), wallet, node],
        )
    )
    return typed_data_digest(domain, struct_hash)


def sign_binding(wallet: str, node_private_key: bytes, domain: Eip712Domain) -> bytes:
    """The node key's signature binding it to ``wallet`` (for registerNode)."""
    node = node_address_of(node_public_key(node_private_key))
    return sign_digest(binding_digest(wallet, node, domain), node_private_key)


# ---------------------------------------------------------------- certificates


@dataclass(frozen=True)
class CertifiedHop:
    """One leaf of a data node's certificate tree; mirrors Solidity's ``CertifiedHop``."""

    index: int
    unitsBefore: int
    worker: str
    units: int
    hopKey: bytes
    receiptDigest: bytes
    signaturesHash: bytes

    def __post_init__(self) -> None:
        check_uint("index", self.index, 64)
        check_uint("unitsBefore", self.unitsBefore, 64)
        check_uint("units", self.units, 64)
        object.__setattr__(self, "worker", checked_address("worker", self.worker))
        for name in ("hopKey", "receiptDigest", "signaturesHash"):
            check_bytes32(name, getattr(self, name))

    def as_tuple(self) -> tuple[object, ...]:
        """The struct as an ABI tuple (also the StandardMerkleTree leaf's values)."""
        return tuple(getattr(self, field.name) for field in fields(self))

    def leaf(self) -> bytes:
        """The leaf hash: StandardMerkleTree's keccak256(keccak256(abi.encode(values)))."""
        r = self
        words = _LEAF_WORDS.pack(
            r.index, r.unitsBefore, _address_bytes(r.worker), r.units, r.hopKey,
            r.receiptDigest, r.signaturesHash,
        )  # fmt: skip
        return keccak256(keccak256(words))

    def sort_key(self) -> tuple[int, bytes]:
        """The order of an honest tree: by worker, then by hop key, strictly increasing."""
        return (int(self.worker, 16), self.hopKey)


def certify_hop(
    receipt: HopReceipt,
    domain: Eip712Domain,
    worker_signature: bytes,
    counterparty_signature: bytes,
    index: int = 0,
    units_before: int = 0,
    proof: Sequence[bytes] = (),
) -> CertifiedHop:
    """The leaf a data node commits for ``receipt`` at ``index`` after ``units_before`` units,
    its two signatures those of the batch that holds it by ``proof``."""
    return CertifiedHop(
        index=index,
        unitsBefore=units_before,
        worker=receipt.worker,
        units=receipt.units,
        hopKey=hop_key(receipt),
        receiptDigest=receipt_digest(receipt, domain),
        signaturesHash=signatures_hash(worker_signature, counterparty_signature, proof),
    )


@dataclass(frozen=True)
class WorkerSpan:
    """One worker's range of a certificate tree as its data node commits it with the root;
    mirrors Solidity's ``WorkerSpan``. A certificate's spans partition its leaves and units by
    strictly increasing worker: span k starts where span k-1 ends."""

    worker: str
    lastIndex: int
    unitsEnd: int

    def __post_init__(self) -> None:
        check_uint("lastIndex", self.lastIndex, 64)
        check_uint("unitsEnd", self.unitsEnd, 64)
        object.__setattr__(self, "worker", checked_address("worker", self.worker))

    def as_tuple(self) -> tuple[object, ...]:
        """The struct as an ABI tuple."""
        return (self.worker, self.lastIndex, self.unitsEnd)


@dataclass(frozen=True)
class SpanRange:
    """A span with where it starts, as one leaf of the range tree; mirrors Solidity's
    ``SpanRange`` (what a span fraud proof shows)."""

    worker: str
    firstIndex: int
    lastIndex: int
    unitsBefore: int
    unitsEnd: int

    def __post_init__(self) -> None:
        for name in ("firstIndex", "lastIndex", "unitsBefore", "unitsEnd"):
            check_uint(name, getattr(self, name), 64)
        object.__setattr__(self, "worker", checked_address("worker", self.worker))

    def as_tuple(self) -> tuple[object, ...]:
        """The struct as an ABI tuple."""
        return (self.worker, self.firstIndex, self.lastIndex, self.unitsBefore, self.unitsEnd)

    def leaf(self) -> bytes:
        """Its leaf of the range tree."""
        return range_leaf(
            self.worker, self.firstIndex, self.lastIndex, self.unitsBefore, self.unitsEnd
        )


def range_leaf(
    worker: str, first_index: int, last_index: int, units_before: int, units_end: int
) -> bytes:
    """A leaf of a certificate's range tree (Solidity's ``HopReceipts.rangeLeaf``): the double
    keccak256 of abi.encode(worker, firstIndex, lastIndex, unitsBefore, unitsEnd)."""
    words = _RANGE_WORDS.pack(
        _address_bytes(worker), first_index, last_index, units_before, units_end.to_bytes(32)
    )
    return keccak256(keccak256(words))


def certificate_commitment(root: bytes, count: int, units: int, ranges_root: bytes) -> bytes:
    """What the ledger stores for a certificate:
    keccak256(abi.encode(root, count, units, rangesRoot))."""
    check_bytes32("root", root)
    check_bytes32("rangesRoot", ranges_root)
    return keccak256(
        encode(["bytes32", "uint64", "uint64", "bytes32"], [root, count, units, ranges_root])
    )


@dataclass(frozen=True)
class CertRef:
    """A data node's certificate for one epoch, as submitted (the ledger stores its
    commitment); mirrors Solidity's ``CertRef``."""

    runId: int
    epoch: int
    dataNode: str
    root: bytes
    count: int
    units: int
    rangesRoot: bytes  # the root of the range tree over the spans submitted with it

    def as_tuple(self) -> tuple[object, ...]:
        """The struct as an ABI tuple."""
        return (
            self.runId, self.epoch, self.dataNode, self.root, self.count, self.units,
            self.rangesRoot,
        )  # fmt: skip

    def commitment(self) -> bytes:
        """What the ledger stores for this certificate."""
        return certificate_commitment(self.root, self.count, self.units, self.rangesRoot)
