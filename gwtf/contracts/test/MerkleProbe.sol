// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.28;

import {MerkleProof} from "@openzeppelin/contracts/utils/cryptography/MerkleProof.sol";

/// @title MerkleProbe
/// @notice Test-only window on OpenZeppelin's MerkleProof, the verifier the ledger uses, so the
/// Python tree can be checked against it on random inputs.
contract MerkleProbe {
    /// @notice The root a proof leads to from a leaf.
    /// @param proof Sibling hashes.
    /// @param leaf The leaf.
    /// @return The computed root.
    function processProof(bytes32[] calldata proof, bytes32 leaf) external pure returns (bytes32) {
        return MerkleProof.processProofCalldata(proof, leaf);
    }

    /// @notice Whether the leaf is in the tree with `root`.
    /// @param proof Sibling hashes.
    /// @param root The root.
    /// @param leaf The leaf.
    /// @return True when the proof holds.
    function verify(bytes32[] calldata proof, bytes32 root, bytes32 leaf) external pure returns (bool) {
        return MerkleProof.verifyCalldata(proof, root, leaf);
    }
}
