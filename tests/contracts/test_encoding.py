"""The Python mirror of the on-chain encoding: golden vectors (an encoding change is noticed),
an independent EIP-712 implementation (eth-account) as a cross-check, and agreement with the
deployed contracts on random inputs."""

from __future__ import annotations

import pytest
from eth_account import Account
from eth_account.messages import encode_typed_data
from eth_utils.crypto import keccak
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contracts.encoding import (
    HOP_RECEIPT_TYPE,
    HopReceipt,
    binding_digest,
    claim_commitment,
    hop_key,
    ledger_domain,
    receipt_digest,
    receipt_leaf,
    receipt_struct_hash,
    recover_signer,
    registry_domain,
    sign_receipt,
)
from contracts.merkle import build_tree
from gwtf.errors import ProtocolError
from tests.contracts.world import World

GOLDEN_KEY = keccak(text="golden counterparty")
GOLDEN_DOMAIN = ledger_domain(1, "0x" + "11" * 20)
GOLDEN_RECEIPT = HopReceipt(
    runId=7,
    epoch=3,
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

GOLDEN = {
    "separator": "165e19ef8377444b4d537c8aaa45e815ed42a2c4a3ab59f977533848c4f7e1ed",
    "struct": "0b76384e26a78dc6933440eef39952924015d3e739882843c18d80983b0e0789",
    "digest": "a2420ab48cc20532e9c68bca1d19411fa5daf1e1041bb95de2f1924d857e6c5d",
    "signature": "eb34948defe8bd3b09deb87a65593a9ea640ab625af8c106017c8d758d687db8"
    "065831c53496f38d69cfacb5ec5a8da70df6dd5df04a4e8bda1a93ee61af2aa71b",
    "leaf": "f02f7b3b07f87d9dd4d2614cdd72a07cb0014269f183d27e358b1ebc5a1cc43c",
    "hop_key": "5cbd2476461650e501dbf9716f5299edb45c44917b35eaccf6f8c8edd0c3f04c",
    "binding": "f253c6227e906cef012672b0a43f5e6d662fe48a727b6a4ad172a560663c045a",
    "commitment": "d2b3664a4cacbfd876ad899c1ddca2dc95ea6c3aeeb0cc0aedd47e4ec79a8aaf",
    "root5": "11aeafa56c9b34805cc86b1c320c9331672c07e600f0a44317051cfa05a0c296",
}


def test_golden_vectors() -> None:
    signature = sign_receipt(GOLDEN_RECEIPT, GOLDEN_DOMAIN, GOLDEN_KEY)
    peer = b"\x00\x24peer"
    binding = binding_digest(
        "0x" + "33" * 20, peer, "0x" + "44" * 20, registry_domain(1, "0x" + "22" * 20)
    )
    computed = {
        "separator": GOLDEN_DOMAIN.separator().hex(),
        "struct": receipt_struct_hash(GOLDEN_RECEIPT).hex(),
        "digest": receipt_digest(GOLDEN_RECEIPT, GOLDEN_DOMAIN).hex(),
        "signature": signature.hex(),
        "leaf": receipt_leaf(GOLDEN_RECEIPT, GOLDEN_DOMAIN, 5, 900, signature).hex(),
        "hop_key": hop_key(GOLDEN_RECEIPT).hex(),
        "binding": binding.hex(),
        "commitment": claim_commitment(b"\x55" * 32, 10, 1500).hex(),
        "root5": build_tree([keccak(bytes([i])) for i in range(5)]).root.hex(),
    }
    assert computed == GOLDEN


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
    assert bytes(signed.signature) == sign_receipt(GOLDEN_RECEIPT, GOLDEN_DOMAIN, GOLDEN_KEY)


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


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("stage", 1 << 16),
        ("direction", 2),
        ("runId", -1),
        ("worker", "0x12"),
        ("inputDigest", b"x"),
    ],
)
def test_receipt_rejects_out_of_range_fields(field: str, value: object) -> None:
    fields = dict(zip(HopReceipt.__dataclass_fields__, GOLDEN_RECEIPT.as_tuple(), strict=True))
    fields[field] = value
    with pytest.raises(ProtocolError, match=field):
        HopReceipt(**fields)  # type: ignore[arg-type]


addresses = st.binary(min_size=20, max_size=20).map(lambda raw: "0x" + raw.hex())
receipts = st.builds(
    HopReceipt,
    runId=st.integers(0, 2**256 - 1),
    epoch=st.integers(0, 2**64 - 1),
    iteration=st.integers(0, 2**64 - 1),
    microbatchId=st.integers(0, 2**64 - 1),
    stage=st.integers(0, 2**16 - 1),
    direction=st.integers(0, 1),
    attempt=st.integers(0, 2**16 - 1),
    worker=addresses,
    counterparty=addresses,
    inputDigest=st.binary(min_size=32, max_size=32),
    outputDigest=st.binary(min_size=32, max_size=32),
    units=st.integers(0, 2**64 - 1),
)
MIRROR = settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@MIRROR
@given(
    receipt=receipts,
    index=st.integers(0, 2**64 - 1),
    units_before=st.integers(0, 2**64 - 1),
    signature=st.binary(max_size=80),
)
def test_receipt_digest_and_leaf_agree_with_contract(
    world: World, receipt: HopReceipt, index: int, units_before: int, signature: bytes
) -> None:
    ledger = world.ledger
    domain = world.ledger_domain
    assert ledger.functions.receiptDigest(receipt.as_tuple()).call() == receipt_digest(
        receipt, domain
    )
    leaf_struct = (receipt.as_tuple(), index, units_before, signature, [])
    assert ledger.functions.leafHash(leaf_struct).call() == receipt_leaf(
        receipt, domain, index, units_before, signature
    )


@MIRROR
@given(wallet=addresses, node=addresses, peer_id=st.binary(min_size=1, max_size=128))
def test_binding_digest_agrees_with_contract(
    world: World, wallet: str, node: str, peer_id: bytes
) -> None:
    on_chain = world.registry.functions.bindingDigest(
        world.w3.to_checksum_address(wallet), peer_id, world.w3.to_checksum_address(node)
    ).call()
    assert on_chain == binding_digest(wallet, peer_id, node, world.registry_domain)
