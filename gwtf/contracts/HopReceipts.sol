// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.28;

import {MerkleProof} from "@openzeppelin/contracts/utils/cryptography/MerkleProof.sol";

/// @notice One relay stage's forward or backward of one microbatch. The worker signs it and the
/// counterparty that received the output countersigns it, as a leaf of a `HopBatch` (EIP-712,
/// domain "GWTF Ledger" v1 of the WorkLedger). The field names are those of
/// `contracts/encoding.py`.
struct HopReceipt {
    uint256 runId;
    uint64 epoch;
    address dataNode; // the data node whose microbatch this is; it certifies the hop
    uint64 iteration;
    uint64 microbatchId;
    uint16 stage; // relay stage, 1..stageCount (0 is the data nodes)
    uint8 direction; // 0 forward, 1 backward
    uint16 attempt; // numbered by the sender; a re-send after a crash is a new attempt
    address worker;
    address counterparty;
    bytes32 inputDigest;
    bytes32 outputDigest;
    uint64 units;
}

/// @notice A hop as a data node certifies it: one leaf of its certificate tree for an epoch.
/// The tree is OpenZeppelin's StandardMerkleTree over these seven values with the leaves in
/// index order; an honest tree sorts them by (worker, hopKey), strictly, so each worker's hops
/// form one range, and `unitsBefore` is the sum of the units of the leaves before it.
struct CertifiedHop {
    uint64 index;
    uint64 unitsBefore;
    address worker;
    uint64 units;
    bytes32 hopKey;
    bytes32 receiptDigest;
    bytes32 signaturesHash; // keccak256(abi.encode(BatchSeal)): how the receipt is signed
}

/// @notice What a worker signs and its counterparty countersigns (EIP-712): the root of a
/// Merkle tree (OpenZeppelin's sorted pairs) over the digests of receipts of one run and epoch
/// in which `worker` worked for `counterparty`. Never passed whole: the contract rebuilds it
/// from a receipt (run, epoch, parties) and the receipt's proof in it (the root), so a receipt
/// is in a batch exactly when the batch's signatures recover over what it rebuilds. A batch of
/// one is the receipt alone, its root the receipt's digest and its proof empty.
struct HopBatch {
    uint256 runId;
    uint64 epoch;
    address worker;
    address counterparty;
    bytes32 root;
}

/// @notice How a certified receipt is signed: its proof in its batch and the batch's two
/// signatures. A certificate leaf commits to it (`signaturesHash`).
struct BatchSeal {
    bytes32[] proof;
    bytes workerSignature;
    bytes counterpartySignature;
}

/// @notice One party's signature of the batch that holds a receipt, with the receipt's proof.
struct BatchSignature {
    bytes32[] proof;
    bytes signature;
}

/// @notice One worker's range of a certificate tree as its data node commits it with the root.
/// The spans of a certificate partition it in worker order: span k covers the leaves after span
/// k-1's `lastIndex` up to its own, and the units after span k-1's `unitsEnd` up to its own, so
/// no two workers' ranges can share a leaf or a unit.
struct WorkerSpan {
    address worker;
    uint64 lastIndex;
    uint64 unitsEnd;
}

/// @notice A leaf of a certificate's range tree in full: one span with where it starts (the
/// leaf after the previous span's `lastIndex`, the units after its `unitsEnd`), as a span
/// fraud proof shows it.
struct SpanRange {
    address worker;
    uint64 firstIndex;
    uint64 lastIndex;
    uint64 unitsBefore;
    uint64 unitsEnd;
}

/// @notice A data node's certificate commitment for one epoch, as submitted.
struct CertRef {
    uint256 runId;
    uint64 epoch;
    address dataNode;
    bytes32 root;
    uint64 count;
    uint64 units;
    bytes32 rangesRoot; // the root of the range tree over its spans, computed on submission
}

/// @title HopReceipts
/// @notice Hashing rules of hop receipts and certificate leaves, shared by the ledger and the
/// disputes contract and mirrored byte for byte by `contracts/encoding.py`.
library HopReceipts {
    bytes32 internal constant HOP_RECEIPT_TYPEHASH = keccak256(
        "HopReceipt(uint256 runId,uint64 epoch,address dataNode,uint64 iteration,uint64 microbatchId,"
        "uint16 stage,uint8 direction,uint16 attempt,address worker,address counterparty,"
        "bytes32 inputDigest,bytes32 outputDigest,uint64 units)"
    );
    bytes32 internal constant HOP_BATCH_TYPEHASH =
        keccak256("HopBatch(uint256 runId,uint64 epoch,address worker,address counterparty,bytes32 root)");
    bytes32 internal constant DOMAIN_TYPEHASH =
        keccak256("EIP712Domain(string name,string version,uint256 chainId,address verifyingContract)");
    bytes32 internal constant LEDGER_NAME_HASH = keccak256("GWTF Ledger");
    bytes32 internal constant LEDGER_VERSION_HASH = keccak256("1");

    uint8 internal constant FORWARD = 0;
    uint8 internal constant BACKWARD = 1;

    /// @dev EIP-712 hashStruct of a receipt.
    function structHash(HopReceipt calldata receipt) internal pure returns (bytes32) {
        return keccak256(abi.encode(HOP_RECEIPT_TYPEHASH, receipt));
    }

    /// @dev The receipt's EIP-712 digest under the ledger at `ledger` on this chain (the same
    /// digest OpenZeppelin's EIP712 of the ledger computes): a leaf of the batch that holds it.
    function digest(HopReceipt calldata receipt, address ledger) internal view returns (bytes32) {
        return _typed(structHash(receipt), ledger);
    }

    /// @dev What the worker and the counterparty of `receipt` sign for it: the EIP-712 digest
    /// of the batch of its run, epoch and parties whose root `proof` leads to from its digest
    /// `receiptDigest`.
    function batchDigest(
        HopReceipt calldata receipt,
        bytes32 receiptDigest,
        bytes32[] calldata proof,
        address ledger
    ) internal view returns (bytes32) {
        bytes32 root = MerkleProof.processProofCalldata(proof, receiptDigest);
        return _typed(
            keccak256(abi.encode(HOP_BATCH_TYPEHASH, receipt.runId, receipt.epoch, receipt.worker, receipt.counterparty, root)),
            ledger
        );
    }

    function _typed(bytes32 hashStruct, address ledger) private view returns (bytes32) {
        bytes32 separator =
            keccak256(abi.encode(DOMAIN_TYPEHASH, LEDGER_NAME_HASH, LEDGER_VERSION_HASH, block.chainid, ledger));
        return keccak256(abi.encodePacked("\x19\x01", separator, hashStruct));
    }

    /// @dev What makes a hop unique: one worker's try at one stage and direction of one
    /// microbatch of one data node. Two receipts with one key and different contents are
    /// conflicting statements of whoever signed both.
    function hopKey(HopReceipt calldata receipt) internal pure returns (bytes32) {
        return keccak256(
            abi.encode(
                receipt.runId,
                receipt.epoch,
                receipt.dataNode,
                receipt.microbatchId,
                receipt.stage,
                receipt.direction,
                receipt.attempt,
                receipt.worker
            )
        );
    }

    /// @dev The certificate tree's leaf: StandardMerkleTree's double hash of the leaf's values,
    /// so a leaf preimage is never 64 bytes and cannot pass for an inner node.
    function leaf(CertifiedHop calldata hop) internal pure returns (bytes32) {
        return keccak256(bytes.concat(keccak256(abi.encode(hop))));
    }

    /// @dev A leaf of a certificate's range tree: one worker's range (its first and last leaf
    /// index, the units before it and where its units end), double hashed like a hop leaf.
    function rangeLeaf(address worker, uint64 firstIndex, uint64 lastIndex, uint64 unitsBefore, uint256 unitsEnd)
        internal
        pure
        returns (bytes32)
    {
        return keccak256(bytes.concat(keccak256(abi.encode(worker, firstIndex, lastIndex, unitsBefore, unitsEnd))));
    }

    /// @dev What a certificate leaf commits of how its receipt is signed.
    function signaturesHash(BatchSeal calldata seal) internal pure returns (bytes32) {
        return keccak256(abi.encode(seal.proof, seal.workerSignature, seal.counterpartySignature));
    }

    /// @dev The run's schedule: a backward hop costs twice the forward compute of a stage.
    function scheduledUnits(uint8 direction, uint64 unitsPerHop) internal pure returns (uint256) {
        return direction == FORWARD ? uint256(unitsPerHop) : 2 * uint256(unitsPerHop);
    }
}
