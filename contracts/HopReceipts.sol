// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.28;

/// @notice One stage's forward or backward of one microbatch, signed by the worker and
/// countersigned (EIP-712, domain "GWTF Ledger" v1) by the counterparty that received the output.
/// The field names are those of `contracts/encoding.py`.
struct HopReceipt {
    uint256 runId;
    uint64 epoch;
    uint64 iteration;
    uint64 microbatchId;
    uint16 stage;
    uint8 direction; // 0 forward, 1 backward
    uint16 attempt; // numbered by the sender; a re-send after a crash is a new attempt
    address worker;
    address counterparty;
    bytes32 inputDigest;
    bytes32 outputDigest;
    uint64 units;
}

/// @notice A receipt as committed in a node's epoch tree, with its Merkle proof.
/// `index` is the leaf's position in the node's list; `unitsBefore` the sum of the units of the
/// leaves before it, so the leaves 0..count-1 of an honest tree chain up to the claimed units.
struct LeafProof {
    HopReceipt receipt;
    uint64 index;
    uint64 unitsBefore;
    bytes counterpartySignature;
    bytes32[] proof;
}

/// @title HopReceipts
/// @notice Hashing rules of hop receipts and their tree leaves, shared by the ledger and mirrored
/// byte for byte by `contracts/encoding.py`.
library HopReceipts {
    bytes32 internal constant HOP_RECEIPT_TYPEHASH = keccak256(
        "HopReceipt(uint256 runId,uint64 epoch,uint64 iteration,uint64 microbatchId,uint16 stage,"
        "uint8 direction,uint16 attempt,address worker,address counterparty,bytes32 inputDigest,"
        "bytes32 outputDigest,uint64 units)"
    );

    uint8 internal constant FORWARD = 0;
    uint8 internal constant BACKWARD = 1;

    /// @dev EIP-712 hashStruct of a receipt.
    function structHash(HopReceipt calldata receipt) internal pure returns (bytes32) {
        return keccak256(
            abi.encode(
                HOP_RECEIPT_TYPEHASH,
                receipt.runId,
                receipt.epoch,
                receipt.iteration,
                receipt.microbatchId,
                receipt.stage,
                receipt.direction,
                receipt.attempt,
                receipt.worker,
                receipt.counterparty,
                receipt.inputDigest,
                receipt.outputDigest,
                receipt.units
            )
        );
    }

    /// @dev The tree leaf: double-hashed like OpenZeppelin's StandardMerkleTree, so that a leaf
    /// preimage is never 64 bytes and cannot pass for an inner node.
    function leaf(bytes32 receiptDigest, uint64 index, uint64 unitsBefore, bytes calldata signature)
        internal
        pure
        returns (bytes32)
    {
        return keccak256(
            bytes.concat(keccak256(abi.encode(receiptDigest, index, unitsBefore, keccak256(signature))))
        );
    }

    /// @dev What makes a hop unique: claiming the same key twice is a double claim.
    function hopKey(HopReceipt calldata receipt) internal pure returns (bytes32) {
        return keccak256(
            abi.encode(
                receipt.runId,
                receipt.epoch,
                receipt.microbatchId,
                receipt.stage,
                receipt.direction,
                receipt.attempt
            )
        );
    }

    /// @dev The run's schedule: a backward hop costs twice the forward compute of a stage.
    function scheduledUnits(uint8 direction, uint64 unitsPerHop) internal pure returns (uint256) {
        return direction == FORWARD ? uint256(unitsPerHop) : 2 * uint256(unitsPerHop);
    }
}
