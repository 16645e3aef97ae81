// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.28;

import {Ownable} from "@openzeppelin/contracts/access/Ownable.sol";
import {Ownable2Step} from "@openzeppelin/contracts/access/Ownable2Step.sol";
import {EIP712} from "@openzeppelin/contracts/utils/cryptography/EIP712.sol";
import {Hashes} from "@openzeppelin/contracts/utils/cryptography/Hashes.sol";
import {MerkleProof} from "@openzeppelin/contracts/utils/cryptography/MerkleProof.sol";
import {CertifiedHop, CertRef, HopReceipt, HopReceipts, WorkerSpan} from "./HopReceipts.sol";
import {NodeRegistry} from "./NodeRegistry.sol";
import {RunBook} from "./RunBook.sol";

/// @notice The disputes contract's answer to whether a worker's claims of an epoch wait for a
/// ruling.
interface IClaimFreeze {
    function claimsFrozen(uint256 runId, uint64 epoch, address node) external view returns (bool);
}

/// @title WorkLedger
/// @notice The work a run pays for, and the paying. Per run and epoch each of the run's data
/// nodes commits the Merkle root of its certificate tree: every hop of the microbatches it
/// completed (and the acknowledged hops of attempts lost to crashes), one leaf each, sorted by
/// worker. A certificate is accepted only if the run's escrow covers every one of its hops at
/// the run's price, and that pay is reserved for it. Only certified hops earn: after the epoch
/// settles, each worker claims its range of every data node's tree and is paid the run's price
/// for each hop of it, by pull, whatever else was certified. The ranges are committed with the
/// root as a partition of the tree's leaves and units by worker, checked on submission, so no
/// claim can count a unit another worker's claim counts. The disputes contract voids a
/// certificate proven fraudulent before then and names the (run, epoch) in which a node was
/// convicted (it is not paid there). A reservation is paid to workers or burned, never
/// returned: neither a conviction, nor a withheld tree, nor an unclaimed range pays the
/// sponsor back what it owed for certified work.
/// @dev A certificate is stored as one slot, keccak256(abi.encode(root, count, units,
/// rangesRoot)); callers pass the CertRef (from the CertificatesSubmitted event) and the ledger
/// checks it.
contract WorkLedger is RunBook, EIP712, Ownable2Step {
    using HopReceipts for HopReceipt;

    /// @dev Slot 0 is written by submissions, slot 1 by claims. Each certificate reserves its
    /// units at the run's price, so budgetWei / totalUnits is always that price per unit and a
    /// claim's pay depends on nothing but its own units.
    struct EpochBook {
        uint128 budgetWei; // what the epoch's certificates not voided reserved
        uint96 totalUnits; // units of certificates not voided
        bool certified; // the epoch has a certificate not voided
        uint96 paidUnits;
        uint128 paidWei;
        bool closed; // all paid, or the claim period over: what was left went back to the pool
    }

    bytes32 internal constant VOIDED = bytes32(uint256(1));
    /// @notice How long after an epoch settles its rewards may be claimed; what is left then
    /// (unclaimed ranges, units nobody can claim) returns to the run's pool.
    uint256 public constant CLAIM_PERIOD_S = 90 days;

    /// @notice The only contract that may void a certificate; set once by the owner.
    address public disputes;
    /// @notice Reservations of voided certificates and what closed epochs left unclaimed (the
    /// pay of convicted nodes included): ETH nobody will ever withdraw.
    uint256 public burnedWei;

    mapping(uint256 runId => mapping(uint64 epoch => mapping(address dataNode => bytes32))) internal _certificates;
    mapping(uint256 runId => mapping(uint64 epoch => EpochBook)) internal _books;
    mapping(bytes32 claimKey => bool) internal _claimed;
    /// @dev keccak256(abi.encode(runId, epoch, node)) of each (run, epoch) in which the disputes
    /// contract convicted a node: it is not paid there, its other work stands.
    mapping(bytes32 convictionKey => bool) internal _convicted;

    event DisputesSet(address indexed disputes);
    /// @notice A certificate's commitment with its spans in full: an auditor reads the spans
    /// the data node committed here, whatever wallet or contract submitted them.
    event CertificatesSubmitted(
        uint256 indexed runId,
        uint64 indexed epoch,
        address indexed dataNode,
        bytes32 root,
        uint64 count,
        uint64 units,
        bytes32 rangesRoot,
        WorkerSpan[] spans
    );
    event PayReserved(uint256 indexed runId, uint64 indexed epoch, address indexed dataNode, uint256 reservedWei);
    event CertificateVoided(uint256 indexed runId, uint64 indexed epoch, address indexed dataNode, uint64 units);
    event ConvictionRecorded(uint256 indexed runId, uint64 indexed epoch, address indexed node);
    event RewardClaimed(
        uint256 indexed runId,
        uint64 indexed epoch,
        address indexed node,
        address dataNode,
        address wallet,
        uint64 units,
        uint256 amountWei
    );
    event EpochClosed(uint256 indexed runId, uint64 indexed epoch, uint256 burnedWei);

    error DisputesAlreadySet(address disputes);
    error NotDisputes(address caller);
    error ZeroAddress();
    error SubmissionClosed(uint256 runId, uint64 epoch, uint256 opensAt, uint256 closesAt);
    error EpochAfterClose(uint256 runId, uint64 epoch, uint64 lastEpoch);
    error NotDataNode(uint256 runId, address node);
    error NodeNotBonded(address node);
    error EmptyCertificate();
    error UnitsOutOfRange(uint256 units, uint256 minUnits, uint256 maxUnits);
    error BudgetShort(uint256 runId, uint64 epoch, uint256 neededWei, uint256 coverableWei);
    error CertificateAlreadySubmitted(uint256 runId, uint64 epoch, address dataNode);
    error CertificateNotOpen(uint256 runId, uint64 epoch, address dataNode);
    error CertificateMismatch(uint256 runId, uint64 epoch, address dataNode);
    error LeafNotInTree(address dataNode, uint64 index);
    error NotWorkersRange(address node, uint64 first, uint64 last);
    error BadSpans(uint256 position);
    error AlreadyClaimed(uint256 runId, uint64 epoch, address dataNode, address node);
    error ClaimantConvicted(uint256 runId, uint64 epoch, address node);
    error ClaimFrozen(address node);
    error NotSettled(uint256 runId, uint64 epoch, uint256 settlesAt);
    error ClaimPeriodOver(uint256 runId, uint64 epoch, uint256 closedAt);
    error ClaimPeriodOpen(uint256 runId, uint64 epoch, uint256 closesAt);

    /// @param registry_ The NodeRegistry whose stakes back the nodes.
    /// @param owner_ Account that names the disputes contract once after deployment.
    constructor(NodeRegistry registry_, address owner_)
        RunBook(registry_)
        EIP712("GWTF Ledger", "1")
        Ownable(owner_)
    {}

    /// @notice Names the disputes contract, the only one that may void a certificate. Once, by
    /// the owner.
    /// @param disputes_ The Disputes address.
    function setDisputes(address disputes_) external onlyOwner {
        if (disputes != address(0)) revert DisputesAlreadySet(disputes);
        if (disputes_ == address(0)) revert ZeroAddress();
        disputes = disputes_;
        emit DisputesSet(disputes_);
    }

    // ---------------------------------------------------------------- certificates

    /// @notice Commits a data node's certificate tree for a finished epoch. The data node's
    /// wallet (the sponsor's) only, once per epoch, during the epoch after it, for a data node
    /// that was bonded during the epoch (one convicted since still certifies the work done with
    /// it). Reserves `units` at the run's price out of the run's funds: refused unless the funds,
    /// and what the epoch may still reserve under rewardPerEpoch, cover every hop. `spans` are
    /// the workers' ranges of the tree, which claims are held to: strictly increasing workers,
    /// each span ending after the one before, the last at leaf count-1 and at `units`.
    /// @param runId The run.
    /// @param epoch The finished epoch.
    /// @param dataNode The data node whose certificates the tree holds.
    /// @param root The Merkle root of the certified hops.
    /// @param count Number of leaves (indices 0..count-1).
    /// @param units Sum of the hops' units.
    /// @param spans Each worker's range, in worker order.
    function submitCertificates(
        uint256 runId,
        uint64 epoch,
        address dataNode,
        bytes32 root,
        uint64 count,
        uint64 units,
        WorkerSpan[] calldata spans
    ) external {
        Run storage run = _existingRun(runId);
        if (epoch > run.lastEpoch) revert EpochAfterClose(runId, epoch, run.lastEpoch);
        uint256 startsAt = uint256(run.startTime) + uint256(epoch) * run.epochLengthS;
        uint256 opensAt = startsAt + run.epochLengthS;
        if (block.timestamp < opensAt || block.timestamp >= opensAt + run.epochLengthS) {
            revert SubmissionClosed(runId, epoch, opensAt, opensAt + run.epochLengthS);
        }
        if (count == 0) revert EmptyCertificate();
        uint256 minUnits = uint256(count) * run.unitsPerHop;
        if (units < minUnits || units > 2 * minUnits) revert UnitsOutOfRange(units, minUnits, 2 * minUnits);
        if (!wasDataNodeBefore(runId, dataNode, opensAt)) revert NotDataNode(runId, dataNode);
        (address wallet,,) = registry.bondOf(dataNode);
        if (wallet != msg.sender) revert NotNodeWallet(dataNode, msg.sender);
        // Bonded during the epoch is enough: a data node convicted since (its stake gone) still
        // certifies the epoch's work, so a conviction costs honest relays no other epoch. A
        // fraud in such a certificate is still voided (its reservation burned); the sponsor
        // could as well not submit it, so this gives its data node no new power.
        if (!registry.bondedDuring(dataNode, startsAt, opensAt)) revert NodeNotBonded(dataNode);
        mapping(address => bytes32) storage epochCertificates = _certificates[runId][epoch];
        if (epochCertificates[dataNode] != bytes32(0)) revert CertificateAlreadySubmitted(runId, epoch, dataNode);

        // The range tree's root is committed with the root: one leaf per worker over spans
        // checked here to partition the certificate.
        bytes32 rangesRoot = _rangesRootOf(spans, count, units);
        epochCertificates[dataNode] = keccak256(abi.encode(root, count, units, rangesRoot));
        EpochBook storage book = _books[runId][epoch];
        uint256 reserved = priceOf(run, units);
        uint256 epochRoom = uint256(run.rewardPerEpochWei) - book.budgetWei;
        uint256 coverable = epochRoom < run.availableWei ? epochRoom : run.availableWei;
        if (reserved > coverable) revert BudgetShort(runId, epoch, reserved, coverable);
        run.availableWei -= uint128(reserved);
        book.budgetWei += uint128(reserved); // at most rewardPerEpochWei
        // Checked: a uint96 sum holds 2^32 maximal uint64 certificates before it would revert.
        book.totalUnits += uint96(units);
        book.certified = true;
        emit PayReserved(runId, epoch, dataNode, reserved);
        emit CertificatesSubmitted(runId, epoch, dataNode, root, count, units, rangesRoot, spans);
    }

    /// @notice Voids a certificate the disputes contract has proven fraudulent (always before
    /// its epoch settles, so nothing of it was paid): its units leave the epoch's total and its
    /// reservation is burned. Returned to the run, it would let a sponsor who has its own data
    /// node convicted win back pay it owed honest relays for more than the stake it loses.
    /// @param cert The certificate, as submitted.
    function voidCertificate(CertRef calldata cert) external {
        if (msg.sender != disputes) revert NotDisputes(msg.sender);
        checkCertificate(cert);
        _certificates[cert.runId][cert.epoch][cert.dataNode] = VOIDED;
        EpochBook storage book = _books[cert.runId][cert.epoch];
        uint256 reserved = priceOf(_runs[cert.runId], cert.units);
        book.totalUnits -= uint96(cert.units);
        book.budgetWei -= uint128(reserved);
        if (book.totalUnits == 0) book.certified = false;
        burnedWei += reserved;
        emit CertificateVoided(cert.runId, cert.epoch, cert.dataNode, cert.units);
    }

    /// @notice Records that the disputes contract convicted `node` of a fault in (run, epoch):
    /// its ranges of that epoch's certificates are paid to no one (burned when the epoch
    /// closes). Its work in other epochs and runs stands unless a proof about that epoch
    /// convicts it too.
    /// @param runId The run.
    /// @param epoch The epoch.
    /// @param node The convicted node.
    /// @return recorded False when the conviction was recorded before.
    function recordConviction(uint256 runId, uint64 epoch, address node) external returns (bool recorded) {
        if (msg.sender != disputes) revert NotDisputes(msg.sender);
        bytes32 key = keccak256(abi.encode(runId, epoch, node));
        if (_convicted[key]) return false;
        _convicted[key] = true;
        emit ConvictionRecorded(runId, epoch, node);
        return true;
    }

    // ---------------------------------------------------------------- rewards

    /// @notice Pays a worker for its range of a data node's certificate tree, after the epoch
    /// settles: the run's price for each hop of it (units × hopPrice / unitsPerHop). The range
    /// is the one committed with the root: its first and last leaf are proven in the tree, and
    /// the span they bound in the range tree. Once per (epoch, data node, worker), by the
    /// node's wallet. A node convicted of a fault in this
    /// (run, epoch) is not paid here (its pay is burned when the epoch closes).
    /// @param cert The data node's certificate.
    /// @param first The worker's first leaf.
    /// @param firstProof Its Merkle proof.
    /// @param last The worker's last leaf (may be the first).
    /// @param lastProof Its Merkle proof.
    /// @param rangeProof The Merkle proof of the worker's span in the certificate's range tree.
    function claimReward(
        CertRef calldata cert,
        CertifiedHop calldata first,
        bytes32[] calldata firstProof,
        CertifiedHop calldata last,
        bytes32[] calldata lastProof,
        bytes32[] calldata rangeProof
    ) external nonReentrant {
        (address node, uint256 units, uint256 amount) =
            _takeRange(cert, first, firstProof, last, lastProof, rangeProof);
        if (_convicted[keccak256(abi.encode(cert.runId, cert.epoch, node))]) {
            revert ClaimantConvicted(cert.runId, cert.epoch, node);
        }
        // A claim of the epoch whose hop a tensor dispute accuses waits for the court's ruling.
        if (IClaimFreeze(disputes).claimsFrozen(cert.runId, cert.epoch, node)) revert ClaimFrozen(node);
        (address wallet,,) = registry.bondOf(node);
        if (wallet != msg.sender) revert NotNodeWallet(node, msg.sender);
        emit RewardClaimed(cert.runId, cert.epoch, node, cert.dataNode, msg.sender, uint64(units), amount);
        if (amount != 0) _send(msg.sender, amount);
    }

    /// @dev Checks a worker's range of a certificate after the epoch settled, marks it taken and
    /// books its pay (the caller sends it).
    function _takeRange(
        CertRef calldata cert,
        CertifiedHop calldata first,
        bytes32[] calldata firstProof,
        CertifiedHop calldata last,
        bytes32[] calldata lastProof,
        bytes32[] calldata rangeProof
    ) private returns (address node, uint256 units, uint256 amount) {
        (,,, uint256 settlesAt) = epochTimes(cert.runId, cert.epoch);
        if (block.timestamp < settlesAt) revert NotSettled(cert.runId, cert.epoch, settlesAt);
        EpochBook storage book = _books[cert.runId][cert.epoch];
        if (book.closed) revert ClaimPeriodOver(cert.runId, cert.epoch, settlesAt + CLAIM_PERIOD_S);
        checkCertificate(cert);
        _checkLeaf(cert, first, firstProof);
        _checkLeaf(cert, last, lastProof);
        node = first.worker;
        uint256 unitsEnd = uint256(last.unitsBefore) + last.units;
        // The range must be the worker's span as committed with the root: spans partition the
        // certificate, so whatever the tree's leaves say, no two claims count one unit, and a
        // span's units are more than the units before it.
        bytes32 range = HopReceipts.rangeLeaf(node, first.index, last.index, first.unitsBefore, unitsEnd);
        if (
            last.worker != node
                || !MerkleProof.verifyCalldata(rangeProof, cert.rangesRoot, range)
        ) revert NotWorkersRange(node, first.index, last.index);
        units = unitsEnd - first.unitsBefore;
        bytes32 claimKey = keccak256(abi.encode(cert.runId, cert.epoch, cert.dataNode, node));
        if (_claimed[claimKey]) revert AlreadyClaimed(cert.runId, cert.epoch, cert.dataNode, node);

        _claimed[claimKey] = true;
        // A worker has one span per certificate and the spans partition its units, so the
        // claims of a certificate never exceed its units, nor the epoch's its units, and a
        // certificate never pays more than it reserved (each pay rounds down).
        uint256 paidUnits = uint256(book.paidUnits) + units;
        Run storage run = _runs[cert.runId];
        amount = priceOf(run, units);
        book.paidUnits = uint96(paidUnits);
        book.paidWei += uint128(amount);
        if (paidUnits == book.totalUnits) {
            // Everything is claimed: what is left (only a dishonest tree's rounding) is burned.
            _closeEpoch(book, cert.runId, cert.epoch);
        }
    }

    /// @notice Once an epoch's claim period is over, burns what was reserved and not claimed
    /// (ranges nobody claimed, a convicted node's, units nobody can). Returned to the run's
    /// pool, it would pay the sponsor for withholding a tree or for a conviction. Anyone may
    /// call; once per epoch.
    /// @param runId The run.
    /// @param epoch The epoch.
    function closeEpoch(uint256 runId, uint64 epoch) external {
        (,,, uint256 settlesAt) = epochTimes(runId, epoch);
        uint256 closesAt = settlesAt + CLAIM_PERIOD_S;
        if (block.timestamp < closesAt) revert ClaimPeriodOpen(runId, epoch, closesAt);
        EpochBook storage book = _books[runId][epoch];
        if (book.closed) revert ClaimPeriodOver(runId, epoch, closesAt);
        _closeEpoch(book, runId, epoch);
    }

    // ---------------------------------------------------------------- views

    /// @notice The EIP-712 digest worker and counterparty sign for `receipt` (binds chain id
    /// and this ledger's address).
    /// @param receipt The receipt.
    /// @return The digest.
    function receiptDigest(HopReceipt calldata receipt) external view returns (bytes32) {
        return _hashTypedDataV4(receipt.structHash());
    }

    /// @notice The hop key of a receipt: two receipts with one key and different contents conflict.
    /// @param receipt The receipt.
    /// @return The key.
    function hopKeyOf(HopReceipt calldata receipt) external pure returns (bytes32) {
        return receipt.hopKey();
    }

    /// @notice A certified hop's leaf hash in a certificate tree.
    /// @param hop The leaf's values.
    /// @return The leaf hash.
    function leafHash(CertifiedHop calldata hop) external pure returns (bytes32) {
        return HopReceipts.leaf(hop);
    }

    /// @notice Reverts unless `cert` is a certificate as submitted and not voided.
    /// @param cert The certificate.
    function checkCertificate(CertRef calldata cert) public view {
        bytes32 stored = _certificates[cert.runId][cert.epoch][cert.dataNode];
        if (stored == bytes32(0) || stored == VOIDED) {
            revert CertificateNotOpen(cert.runId, cert.epoch, cert.dataNode);
        }
        if (stored != keccak256(abi.encode(cert.root, cert.count, cert.units, cert.rangesRoot))) {
            revert CertificateMismatch(cert.runId, cert.epoch, cert.dataNode);
        }
    }

    /// @notice The stored commitment of a certificate: 0 none, 1 voided, else
    /// keccak256(abi.encode(root, count, units, rangesRoot)).
    /// @param runId The run.
    /// @param epoch The epoch.
    /// @param dataNode The data node.
    /// @return The commitment.
    function certificateCommitment(uint256 runId, uint64 epoch, address dataNode) external view returns (bytes32) {
        return _certificates[runId][epoch][dataNode];
    }

    /// @notice The epoch's budget, certified units and what is paid of them.
    /// @param runId The run.
    /// @param epoch The epoch.
    /// @return The book.
    function epochBook(uint256 runId, uint64 epoch) external view returns (EpochBook memory) {
        return _books[runId][epoch];
    }

    /// @notice What `units` of certified work earn in the run: units × hopPrice / unitsPerHop.
    /// @param runId The run.
    /// @param units The units.
    /// @return The wei.
    function payOf(uint256 runId, uint256 units) external view returns (uint256) {
        return priceOf(_existingRun(runId), units);
    }

    /// @notice Whether `node` was convicted of a fault in (run, epoch), where its pay is burned.
    /// @param runId The run.
    /// @param epoch The epoch.
    /// @param node The node.
    /// @return True when convicted there.
    function isConvictedIn(uint256 runId, uint64 epoch, address node) external view returns (bool) {
        return _convicted[keccak256(abi.encode(runId, epoch, node))];
    }

    /// @notice Whether a worker has claimed its range of a data node's tree for an epoch.
    /// @param runId The run.
    /// @param epoch The epoch.
    /// @param dataNode The data node.
    /// @param node The worker.
    /// @return True when claimed.
    function isClaimed(uint256 runId, uint64 epoch, address dataNode, address node) external view returns (bool) {
        return _claimed[keccak256(abi.encode(runId, epoch, dataNode, node))];
    }

    // ---------------------------------------------------------------- internals

    function _closeEpoch(EpochBook storage book, uint256 runId, uint64 epoch) private {
        uint256 burned = uint256(book.budgetWei) - book.paidWei;
        book.closed = true;
        burnedWei += burned;
        emit EpochClosed(runId, epoch, burned);
    }

    /// @dev The pay of `units` at the run's price, rounded down (exact for whole hops): the
    /// claims of a certificate's ranges never add up to more than it reserved.
    function priceOf(Run storage run, uint256 units) internal view returns (uint256) {
        return units * run.hopPriceWei / run.unitsPerHop;
    }

    /// @dev The root of the range tree over `spans` (OpenZeppelin's StandardMerkleTree layout,
    /// leaves in span order), or `BadSpans(k)` unless the spans partition the certificate's
    /// `count` leaves and `units` units by strictly increasing worker, none of them empty.
    function _rangesRootOf(WorkerSpan[] calldata spans, uint64 count, uint64 units) private pure returns (bytes32) {
        uint256 n = spans.length;
        if (n == 0) revert BadSpans(0);
        uint256 size = 2 * n - 1;
        bytes32[] memory nodes = new bytes32[](size);
        address previous;
        uint64 firstIndex;
        uint64 unitsBefore;
        for (uint256 k; k < n; ++k) {
            WorkerSpan calldata span = spans[k];
            if (
                span.worker <= previous || span.lastIndex < firstIndex || span.lastIndex >= count
                    || span.unitsEnd <= unitsBefore
            ) revert BadSpans(k);
            nodes[size - 1 - k] =
                HopReceipts.rangeLeaf(span.worker, firstIndex, span.lastIndex, unitsBefore, span.unitsEnd);
            previous = span.worker;
            firstIndex = span.lastIndex + 1;
            unitsBefore = span.unitsEnd;
        }
        if (firstIndex != count || unitsBefore != units) revert BadSpans(n);
        for (uint256 p = n - 1; p > 0;) {
            --p;
            nodes[p] = Hashes.commutativeKeccak256(nodes[2 * p + 1], nodes[2 * p + 2]);
        }
        return nodes[0];
    }

    function _checkLeaf(CertRef calldata cert, CertifiedHop calldata hop, bytes32[] calldata proof) private pure {
        if (!MerkleProof.verifyCalldata(proof, cert.root, HopReceipts.leaf(hop))) {
            revert LeafNotInTree(cert.dataNode, hop.index);
        }
    }
}
