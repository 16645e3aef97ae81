"""Merkle trees: proofs verify, tampering fails, and OpenZeppelin's MerkleProof (on chain)
computes the same roots as the Python tree."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contracts.bindings import deploy_contract
from contracts.merkle import build_tree, hash_pair, process_proof, verify_proof
from gwtf.errors import ProtocolError
from tests.contracts.world import World

leaf_lists = st.lists(st.binary(min_size=32, max_size=32), min_size=1, max_size=40)


@settings(max_examples=100, deadline=None)
@given(leaves=leaf_lists, data=st.data())
def test_every_leaf_proves_and_tampering_fails(leaves: list[bytes], data: st.DataObject) -> None:
    tree = build_tree(leaves)
    index = data.draw(st.integers(0, len(leaves) - 1))
    proof = tree.proof(index)
    assert verify_proof(proof, tree.root, leaves[index])
    tampered_leaf = bytes([leaves[index][0] ^ 1]) + leaves[index][1:]
    if tampered_leaf not in leaves:
        assert not verify_proof(proof, tree.root, tampered_leaf)
    if proof:
        position = data.draw(st.integers(0, len(proof) - 1))
        bad = list(proof)
        bad[position] = bytes([bad[position][0] ^ 1]) + bad[position][1:]
        assert not verify_proof(bad, tree.root, leaves[index])


def test_pair_hash_is_commutative_and_single_leaf_tree_is_its_leaf() -> None:
    a, b = b"\x01" * 32, b"\x02" * 32
    assert hash_pair(a, b) == hash_pair(b, a)
    assert build_tree([a]).root == a
    assert build_tree([a]).proof(0) == []


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: build_tree([]), "without leaves"),
        (lambda: build_tree([b"short"]), "32 bytes"),
        (lambda: build_tree([b"\x00" * 32]).proof(1), "outside"),
        (lambda: process_proof([b"\x00" * 32] * 65, b"\x00" * 32), "longer"),
    ],
)
def test_bad_input_is_a_protocol_error(call: Any, message: str) -> None:
    with pytest.raises(ProtocolError, match=message):
        call()


@pytest.fixture(scope="module")
def probe(deployed_world: World) -> Any:
    return deploy_contract(deployed_world.w3, "MerkleProbe", deployed_world.deployer)


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(leaves=leaf_lists, data=st.data())
def test_openzeppelin_agrees_with_python_tree(
    probe: Any, leaves: list[bytes], data: st.DataObject
) -> None:
    tree = build_tree(leaves)
    index = data.draw(st.integers(0, len(leaves) - 1))
    proof = tree.proof(index)
    assert probe.functions.processProof(proof, leaves[index]).call() == tree.root
    assert probe.functions.verify(proof, tree.root, leaves[index]).call()
    wrong_root = bytes([tree.root[0] ^ 1]) + tree.root[1:]
    assert not probe.functions.verify(proof, wrong_root, leaves[index]).call()
