"""Merkle trees: proofs verify, tampering fails, OpenZeppelin's MerkleProof (on chain) computes
the same roots as the Python tree, and the Python tree is OpenZeppelin's StandardMerkleTree:
the same roots, leaf hashes and proofs as the ``@openzeppelin/merkle-tree`` package of the npm
lock file, for certificate leaves in index order."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from eth_utils.crypto import keccak
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gwtf.contracts.bindings import deploy_contract
from gwtf.contracts.encoding import CERTIFIED_HOP_ABI_TYPES, CertifiedHop
from gwtf.contracts.merkle import build_tree, hash_pair, process_proof, verify_proof
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


STANDARD_TREE_JS = Path(__file__).with_name("standard_tree.js")


def openzeppelin_trees(trees: list[list[CertifiedHop]]) -> list[dict[str, Any]]:
    """Root, leaf hashes and proofs of each tree's StandardMerkleTree, from OpenZeppelin's
    package (one node process for all)."""

    def values(hop: CertifiedHop) -> list[str]:
        return [
            str(v) if isinstance(v, int) else v if isinstance(v, str) else "0x" + v.hex()
            for v in hop.as_tuple()
        ]

    payload = json.dumps(
        {"types": list(CERTIFIED_HOP_ABI_TYPES), "trees": [[values(h) for h in t] for t in trees]}
    )
    done = subprocess.run(
        ["node", str(STANDARD_TREE_JS)], input=payload, capture_output=True, text=True,
        check=True, timeout=60, cwd=STANDARD_TREE_JS.parents[2],
    )  # fmt: skip
    return list(json.loads(done.stdout))


def hops_of(size: int, seed: int) -> list[CertifiedHop]:
    return [
        CertifiedHop(
            index=i, unitsBefore=100 * i + seed, worker="0x" + f"{(seed + i) % 7:040x}",
            units=100 + i, hopKey=keccak(bytes([i, seed % 256, 1])),
            receiptDigest=keccak(bytes([i, seed % 256, 2])),
            signaturesHash=keccak(bytes([i, seed % 256, 3])),
        )
        for i in range(size)
    ]  # fmt: skip


def test_the_tree_is_openzeppelins_standard_merkle_tree() -> None:
    # Every size from 1 to 33 leaves: complete and incomplete last levels alike.
    trees = [hops_of(size, seed=size) for size in range(1, 34)]
    for hops, theirs in zip(trees, openzeppelin_trees(trees), strict=True):
        ours = build_tree([hop.leaf() for hop in hops])
        assert "0x" + ours.root.hex() == theirs["root"], len(hops)
        assert ["0x" + hop.leaf().hex() for hop in hops] == theirs["leaves"]
        proofs = [["0x" + p.hex() for p in ours.proof(i)] for i in range(len(hops))]
        assert proofs == theirs["proofs"]
