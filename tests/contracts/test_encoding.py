"""The Python mirror of the on-chain encoding: golden vectors pin every rule, an independent
EIP-712 implementation and libp2p agree with it, bad fields are refused, and the contracts
compute the same digests, keys, leaves, bindings, node addresses and peer ids on random
inputs."""

from __future__ import annotations

from typing import Any

import pytest
from eth_abi.abi import encode
from eth_account import Account
from eth_account.messages import encode_typed_data
from eth_utils.crypto import keccak
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from libp2p.crypto.secp256k1 import Secp256k1PublicKey
from libp2p.peer.id import ID

from gwtf.contracts import fraud_proofs
from gwtf.contracts.artifacts import load_artifacts
from gwtf.contracts.certificate_tree import SignedReceipt
from gwtf.contracts.encoding import (
    HOP_BATCH_TYPE,
    HOP_RECEIPT_ABI_TYPES,
    HOP_RECEIPT_FIELDS,
    HOP_RECEIPT_TYPE,
    CertifiedHop,
    HopBatch,
    HopReceipt,
    batch_root,
    binding_digest,
    certificate_commitment,
    certify_hop,
    hop_key,
    ledger_domain,
    node_address_of,
    node_public_key,
    peer_id_of_public_key,
    range_leaf,
    receipt_digest,
    receipt_struct_hash,
    recover_signer,
    registry_domain,
    sign_digest,
    sign_receipt,
    signatures_hash,
    signing_digest,
)
from gwtf.contracts.merkle import build_tree
from gwtf.errors import ProtocolError
from tests.contracts.world import World

GOLDEN_KEY = keccak(text="golden counterparty")
GOLDEN_DOMAIN = ledger_domain(1, "0x" + "11" * 20)
GOLDEN_RECEIPT = HopReceipt(
    runId=7,
    epoch=3,
    dataNode="0x" + "dd" * 20,
    iteration=12,
    microbatchId=49,
    stage=2,
    direction=1,
    attempt=1,
    worker="0x" + "aa" * 20,
    counterparty="0xf1cCb3E6f91dB17B6dd3450CdD5956aF5D8600c0",
    inputDigest=keccak(text="in"),
    outputDigest=keccak(text="out"),
    units=200,
)
GOLDEN_PROOF = (keccak(text="sibling 0"), keccak(text="sibling 1"))

GOLDEN = {
    "separator": "165e19ef8377444b4d537c8aaa45e815ed42a2c4a3ab59f977533848c4f7e1ed",
    "struct": "01598680be6b7461fafcfee76cec5c45f0104541a2563caa3603b4fe94193935",
    "digest": "0f893bad7c4897914d8d33b4d0f718c4783e6241d87a96b95e45ab194914f2f2",
    "signature": "3dd49df94eb601685cfd3f00cd7e9f2be984109f3c84e53625aba4fb6294489a"
    "65d84c6107b15cb76bcea2850b58f1b7003b4abf5d0ebeecc1e69a3a9ad949af1b",
    "batch": "def1f6f5d4b2a8904bc1409354bf987e808d049ec1012e284dbaf16395c34289",
    "batch_of_one": "a8d0f31d12d9a2688d79f0c2e0077b1036189f7043e54cef1ec19db3708b6b90",
    "hop_key": "c5141425490cadcb035e0d12a450efc4922c450baecfdacdf8d280bc59a52f61",
    "signatures_hash": "975c057d3849f5694cf24d7d1240e19d0027802766afdc5717dff6d1172b9798",
    "leaf": "c2e639de69da219c55f92f3d51ac219e5689200c0f4893c2ee1a227c38946806",
    "binding": "ef88ec62b3beb96ea38892cb026c9e02c975966107699d676b6035bbb7a56c12",
    "commitment": "15ddb4bf7445fe8c0fd510288c0a846415a7b4bd597a79e573f29da64da4baba",
    "root5": "4012e3527351abde51ed075bbd7c41097ede613e3e77bc14c1b2900fee859002",
    "node_address": "0xf1cCb3E6f91dB17B6dd3450CdD5956aF5D8600c0",
    "peer_id": "00250802122102c8c1f4f6c0da69ead5616f4548d7e0cdfd506376410e09e1b9dc36e82f4e0a14",
}


def computed_vectors() -> dict[str, str]:
    signature = sign_receipt(GOLDEN_RECEIPT, GOLDEN_DOMAIN, GOLDEN_KEY)
    hop = certify_hop(GOLDEN_RECEIPT, GOLDEN_DOMAIN, signature, signature, 5, 900)
    public_key = node_public_key(GOLDEN_KEY)
    binding = binding_digest(
        "0x" + "33" * 20, "0x" + "44" * 20, registry_domain(1, "0x" + "22" * 20)
    )
    return {
        "separator": GOLDEN_DOMAIN.separator().hex(),
        "struct": receipt_struct_hash(GOLDEN_RECEIPT).hex(),
        "digest": receipt_digest(GOLDEN_RECEIPT, GOLDEN_DOMAIN).hex(),
        "signature": signature.hex(),
        "batch": signing_digest(GOLDEN_RECEIPT, GOLDEN_DOMAIN, GOLDEN_PROOF).hex(),
        "batch_of_one": signing_digest(GOLDEN_RECEIPT, GOLDEN_DOMAIN).hex(),
        "hop_key": hop_key(GOLDEN_RECEIPT).hex(),
        "signatures_hash": signatures_hash(signature, b"\x01" * 65, GOLDEN_PROOF).hex(),
        "leaf": hop.leaf().hex(),
        "binding": binding.hex(),
        "commitment": certificate_commitment(b"\x55" * 32, 10, 1500, b"\x66" * 32).hex(),
        "root5": build_tree([keccak(bytes([i])) for i in range(5)]).root.hex(),
        "node_address": node_address_of(public_key),
        "peer_id": peer_id_of_public_key(public_key).hex(),
    }


def test_golden_vectors() -> None:
    assert computed_vectors() == GOLDEN


def test_the_struct_hash_packs_exactly_what_eth_abi_encodes() -> None:
    reference = keccak(
        encode(
            ["bytes32", *HOP_RECEIPT_ABI_TYPES],
            [keccak(text=HOP_RECEIPT_TYPE), *GOLDEN_RECEIPT.as_tuple()],
        )
    )
    assert receipt_struct_hash(GOLDEN_RECEIPT) == reference
    words = encode(
        ["uint256", "uint64", "address", "uint64", "uint16", "uint8", "uint16", "address"],
        [7, 3, GOLDEN_RECEIPT.dataNode, 49, 2, 1, 1, GOLDEN_RECEIPT.worker],
    )
    assert hop_key(GOLDEN_RECEIPT) == keccak(words)


@given(
    worker=st.binary(min_size=20, max_size=20),
    ends=st.lists(st.integers(0, 2**64 - 1), min_size=4, max_size=4),
)
def test_the_range_leaf_packs_exactly_what_eth_abi_encodes(worker: bytes, ends: list[int]) -> None:
    address = "0x" + worker.hex()
    words = encode(["address", "uint64", "uint64", "uint64", "uint256"], [address, *ends])
    assert range_leaf(address, *ends) == keccak(keccak(words))


@given(
    first=st.binary(max_size=100),
    second=st.binary(max_size=100),
    proof=st.lists(st.binary(min_size=32, max_size=32), max_size=5),
)
def test_the_signatures_hash_packs_exactly_what_eth_abi_encodes(
    first: bytes, second: bytes, proof: list[bytes]
) -> None:
    expected = keccak(encode(["bytes32[]", "bytes", "bytes"], [proof, first, second]))
    assert signatures_hash(first, second, proof) == expected
    assert signatures_hash(first, second) == keccak(
        encode(["bytes32[]", "bytes", "bytes"], [[], first, second])
    )


def struct_params(node: object, struct: str) -> list[dict[str, Any]]:
    """Every parameter of the compiled ABI (inputs, outputs, events) of type ``struct``."""
    if isinstance(node, list):
        return [p for item in node for p in struct_params(item, struct)]
    if not isinstance(node, dict):
        return []
    own = [node] if node.get("internalType") == f"struct {struct}" else []
    return own + [p for value in node.values() for p in struct_params(value, struct)]


def test_the_receipt_record_is_the_contracts_struct() -> None:
    abis = [contract.abi for contract in load_artifacts().contracts.values()]
    params = struct_params(abis, "HopReceipt")
    assert params, "no contract takes a HopReceipt: the artifacts are not the project's"
    for param in params:
        assert [(c["name"], c["type"]) for c in param["components"]] == list(HOP_RECEIPT_FIELDS)
    assert HOP_RECEIPT_TYPE == (
        "HopReceipt(uint256 runId,uint64 epoch,address dataNode,uint64 iteration,"
        "uint64 microbatchId,uint16 stage,uint8 direction,uint16 attempt,address worker,"
        "address counterparty,bytes32 inputDigest,bytes32 outputDigest,uint64 units)"
    )


def test_digest_matches_eth_account_typed_data() -> None:
    """An independent EIP-712 implementation agrees with the mirror."""
    fields = [part.split(" ") for part in HOP_RECEIPT_TYPE[len("HopReceipt(") : -1].split(",")]
    message = {
        "types": {
            "EIP712Domain": [
                {"name": "name", "type": "string"},
                {"name": "version", "type": "string"},
                {"name": "chainId", "type": "uint256"},
                {"name": "verifyingContract", "type": "address"},
            ],
            "HopReceipt": [{"name": name, "type": kind} for kind, name in fields],
        },
        "primaryType": "HopReceipt",
        "domain": {
            "name": GOLDEN_DOMAIN.name,
            "version": GOLDEN_DOMAIN.version,
            "chainId": GOLDEN_DOMAIN.chain_id,
            "verifyingContract": GOLDEN_DOMAIN.verifying_contract,
        },
        "message": dict(zip([name for _, name in fields], GOLDEN_RECEIPT.as_tuple(), strict=True)),
    }
    signable = encode_typed_data(full_message=message)
    expected = keccak(b"\x19" + signable.version + signable.header + signable.body)
    assert expected == receipt_digest(GOLDEN_RECEIPT, GOLDEN_DOMAIN)
    signed = Account.sign_typed_data(GOLDEN_KEY, full_message=message)
    assert bytes(signed.signature) == sign_digest(expected, GOLDEN_KEY)


@pytest.mark.parametrize("proof", [(), GOLDEN_PROOF], ids=["of one", "of three"])
def test_batch_digest_matches_eth_account_typed_data(proof: tuple[bytes, ...]) -> None:
    """An independent EIP-712 implementation agrees on what both parties sign for a receipt:
    the batch of its run, epoch and parties whose root its proof leads to."""
    fields = [part.split(" ") for part in HOP_BATCH_TYPE[len("HopBatch(") : -1].split(",")]
    root = batch_root(receipt_digest(GOLDEN_RECEIPT, GOLDEN_DOMAIN), proof)
    r = GOLDEN_RECEIPT
    message = {
        "types": {
            "EIP712Domain": [
                {"name": "name", "type": "string"},
                {"name": "version", "type": "string"},
                {"name": "chainId", "type": "uint256"},
                {"name": "verifyingContract", "type": "address"},
            ],
            "HopBatch": [{"name": name, "type": kind} for kind, name in fields],
        },
        "primaryType": "HopBatch",
        "domain": {
            "name": GOLDEN_DOMAIN.name,
            "version": GOLDEN_DOMAIN.version,
            "chainId": GOLDEN_DOMAIN.chain_id,
            "verifyingContract": GOLDEN_DOMAIN.verifying_contract,
        },
        "message": {
            "runId": r.runId, "epoch": r.epoch, "worker": r.worker,
            "counterparty": r.counterparty, "root": root,
        },
    }  # fmt: skip
    signed = Account.sign_typed_data(GOLDEN_KEY, full_message=message)
    assert bytes(signed.signature) == sign_receipt(r, GOLDEN_DOMAIN, GOLDEN_KEY, proof)
    assert HopBatch.of(r, root).digest(GOLDEN_DOMAIN) == signing_digest(r, GOLDEN_DOMAIN, proof)
    if not proof:  # a batch of one is the receipt alone, but never its digest
        assert root == receipt_digest(r, GOLDEN_DOMAIN) != signing_digest(r, GOLDEN_DOMAIN)


def test_the_batch_seal_is_the_contracts_struct() -> None:
    abis = [contract.abi for contract in load_artifacts().contracts.values()]
    seals, signed = struct_params(abis, "BatchSeal"), struct_params(abis, "BatchSignature")
    assert seals and signed
    for param in seals:
        assert [(c["name"], c["type"]) for c in param["components"]] == [
            ("proof", "bytes32[]"), ("workerSignature", "bytes"), ("counterpartySignature", "bytes")
        ]  # fmt: skip
    for param in signed:
        assert [(c["name"], c["type"]) for c in param["components"]] == [
            ("proof", "bytes32[]"), ("signature", "bytes")
        ]  # fmt: skip


def test_a_nodes_peer_id_is_libp2ps_for_its_key() -> None:
    public_key = node_public_key(GOLDEN_KEY)
    libp2p_key = Secp256k1PublicKey.from_bytes(bytes([4]) + public_key)
    assert ID.from_pubkey(libp2p_key).to_bytes() == peer_id_of_public_key(public_key)
    assert node_address_of(public_key) == Account.from_key(GOLDEN_KEY).address


def test_recover_signer_round_trip_and_domain_binding() -> None:
    signature = sign_receipt(GOLDEN_RECEIPT, GOLDEN_DOMAIN, GOLDEN_KEY)
    assert recover_signer(GOLDEN_RECEIPT, GOLDEN_DOMAIN, signature) == GOLDEN_RECEIPT.counterparty
    other_chain = ledger_domain(2, GOLDEN_DOMAIN.verifying_contract)
    assert recover_signer(GOLDEN_RECEIPT, other_chain, signature) != GOLDEN_RECEIPT.counterparty


def test_recover_signer_rejects_malleable_and_malformed_signatures() -> None:
    signature = sign_receipt(GOLDEN_RECEIPT, GOLDEN_DOMAIN, GOLDEN_KEY)
    order = 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141
    s = int.from_bytes(signature[32:64], "big")
    flipped_v = 27 if signature[64] == 28 else 28
    malleable = signature[:32] + (order - s).to_bytes(32, "big") + bytes([flipped_v])
    with pytest.raises(ProtocolError, match="malleable"):
        recover_signer(GOLDEN_RECEIPT, GOLDEN_DOMAIN, malleable)
    with pytest.raises(ProtocolError, match="65"):
        recover_signer(GOLDEN_RECEIPT, GOLDEN_DOMAIN, signature[:64])


HALF_ORDER = 0x7FFFFFFFFFFFFFFFFFFFFFFFFFFFFFFF5D576E7357A4501DDFE92F46681B20A0


@pytest.mark.parametrize(
    ("r", "s", "v"),
    [
        (None, HALF_ORDER + 1, None),  # the lowest s OpenZeppelin refuses
        (None, (1 << 256) - 1, None),
        (None, 0, None),
        (0, None, None),
        (None, None, 0),
        (None, None, 1),
        (None, None, 26),
        (None, None, 29),
    ],
)
def test_recover_signer_refuses_what_openzeppelin_refuses(
    r: int | None, s: int | None, v: int | None
) -> None:
    signature = sign_receipt(GOLDEN_RECEIPT, GOLDEN_DOMAIN, GOLDEN_KEY)
    words = [signature[:32], signature[32:64], signature[64:]]
    for at, value, size in ((0, r, 32), (1, s, 32), (2, v, 1)):
        if value is not None:
            words[at] = value.to_bytes(size, "big")
    with pytest.raises(ProtocolError, match="malleable"):
        recover_signer(GOLDEN_RECEIPT, GOLDEN_DOMAIN, b"".join(words))


def test_recover_signer_takes_s_at_half_the_order() -> None:
    """s = n/2 is the highest s OpenZeppelin takes: whatever it recovers to, it is not refused as
    malleable."""
    signature = sign_receipt(GOLDEN_RECEIPT, GOLDEN_DOMAIN, GOLDEN_KEY)
    edge = signature[:32] + HALF_ORDER.to_bytes(32, "big") + signature[64:]
    try:
        assert recover_signer(GOLDEN_RECEIPT, GOLDEN_DOMAIN, edge) != GOLDEN_RECEIPT.counterparty
    except ProtocolError as exc:
        assert "malleable" not in str(exc)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("stage", 1 << 16),
        ("direction", 2),
        ("runId", -1),
        ("worker", "0x12"),
        ("dataNode", "not an address"),
        ("inputDigest", b"x"),
    ],
)
def test_receipt_rejects_out_of_range_fields(field: str, value: object) -> None:
    fields = dict(zip(HopReceipt.__dataclass_fields__, GOLDEN_RECEIPT.as_tuple(), strict=True))
    fields[field] = value
    with pytest.raises(ProtocolError, match=field):
        HopReceipt(**fields)  # type: ignore[arg-type]


def test_a_certified_hop_rejects_bad_fields() -> None:
    good = certify_hop(GOLDEN_RECEIPT, GOLDEN_DOMAIN, b"\x01" * 65, b"\x02" * 65)
    for field, value in (("index", -1), ("units", 1 << 64), ("hopKey", b"short"), ("worker", "0x")):
        values = dict(zip(CertifiedHop.__dataclass_fields__, good.as_tuple(), strict=True))
        values[field] = value
        with pytest.raises(ProtocolError, match=field):
            CertifiedHop(**values)  # type: ignore[arg-type]


addresses = st.binary(min_size=20, max_size=20).map(lambda raw: "0x" + raw.hex())
bytes32 = st.binary(min_size=32, max_size=32)
receipts = st.builds(
    HopReceipt,
    runId=st.integers(0, 2**256 - 1),
    epoch=st.integers(0, 2**64 - 1),
    dataNode=addresses,
    iteration=st.integers(0, 2**64 - 1),
    microbatchId=st.integers(0, 2**64 - 1),
    stage=st.integers(0, 2**16 - 1),
    direction=st.integers(0, 1),
    attempt=st.integers(0, 2**16 - 1),
    worker=addresses,
    counterparty=addresses,
    inputDigest=bytes32,
    outputDigest=bytes32,
    units=st.integers(0, 2**64 - 1),
)
certified_hops = st.builds(
    CertifiedHop,
    index=st.integers(0, 2**64 - 1),
    unitsBefore=st.integers(0, 2**64 - 1),
    worker=addresses,
    units=st.integers(0, 2**64 - 1),
    hopKey=bytes32,
    receiptDigest=bytes32,
    signaturesHash=bytes32,
)
MIRROR = settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@MIRROR
@given(receipt=receipts, hop=certified_hops)
def test_digest_key_and_leaf_agree_with_contract(
    world: World, receipt: HopReceipt, hop: CertifiedHop
) -> None:
    ledger = world.ledger
    assert ledger.functions.receiptDigest(receipt.as_tuple()).call() == receipt_digest(
        receipt, world.ledger_domain
    )
    assert ledger.functions.hopKeyOf(receipt.as_tuple()).call() == hop_key(receipt)
    assert ledger.functions.leafHash(hop.as_tuple()).call() == hop.leaf()


@MIRROR
@given(wallet=addresses, node=addresses)
def test_binding_digest_agrees_with_contract(world: World, wallet: str, node: str) -> None:
    on_chain = world.registry.functions.bindingDigest(
        world.w3.to_checksum_address(wallet), world.w3.to_checksum_address(node)
    ).call()
    assert on_chain == binding_digest(wallet, node, world.registry_domain)


@MIRROR
@given(secret=st.integers(1, 2**255))
def test_node_address_and_peer_id_agree_with_contract(world: World, secret: int) -> None:
    public_key = node_public_key(secret.to_bytes(32, "big"))
    registry = world.registry.functions
    assert registry.nodeAddressOf(public_key).call() == node_address_of(public_key)
    assert registry.peerIdOf(public_key).call() == peer_id_of_public_key(public_key)


@MIRROR
@given(challenger=addresses, salt=bytes32, proof_hash=bytes32)
def test_commitment_agrees_with_contract(
    world: World, challenger: str, salt: bytes, proof_hash: bytes
) -> None:
    on_chain = world.disputes.functions.commitmentOf(
        world.w3.to_checksum_address(challenger), salt, proof_hash
    ).call()
    assert on_chain == fraud_proofs.commitment_of(challenger, salt, proof_hash)


def test_an_entry_keeps_its_signing_digest_for_its_domain_only() -> None:
    entry = SignedReceipt(GOLDEN_RECEIPT, b"\x01" * 65, b"\x02" * 65, GOLDEN_PROOF)
    other = ledger_domain(2, GOLDEN_DOMAIN.verifying_contract)
    first = entry.signing_digest(GOLDEN_DOMAIN)
    assert first == signing_digest(GOLDEN_RECEIPT, GOLDEN_DOMAIN, GOLDEN_PROOF)
    assert entry.signing_digest(other) == signing_digest(GOLDEN_RECEIPT, other, GOLDEN_PROOF)
    assert entry.signing_digest(GOLDEN_DOMAIN) == first != entry.signing_digest(other)
    assert entry == SignedReceipt(GOLDEN_RECEIPT, b"\x01" * 65, b"\x02" * 65, GOLDEN_PROOF)
