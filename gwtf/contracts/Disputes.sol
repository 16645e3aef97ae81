// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.28;

import {ReentrancyGuard} from "@openzeppelin/contracts/utils/ReentrancyGuard.sol";
import {ECDSA} from "@openzeppelin/contracts/utils/cryptography/ECDSA.sol";
import {MerkleProof} from "@openzeppelin/contracts/utils/cryptography/MerkleProof.sol";
import {Court} from "./Court.sol";
import {BatchSeal, BatchSignature, CertifiedHop, CertRef, HopReceipt, HopReceipts, SpanRange} from "./HopReceipts.sol";
import {HopRules} from "./HopRules.sol";
import {NodeRegistry} from "./NodeRegistry.sol";
import {WorkLedger} from "./WorkLedger.sol";

/// @title Disputes
/// @notice Fraud the chain judges alone, and who pays for it: the key that signed or committed
/// the fraud. A data node whose certificate tree breaks a rule loses its stake and the tree is
/// voided; a node that signed two different receipts for one hop (as worker, or as
/// counterparty) loses its stake. Nobody else is ever slashed. Proofs are accepted until the
/// epoch settles, each revealed within `revealWindowBlocks` after the challenger committed to
/// it in an earlier block. The bounty (`bountyBps` of the slashed stake, a small share so that
/// reporting oneself never pays) goes to the proven challenger whose commitment came first,
/// not to the first reveal: a proof copied or front-run from the mempool loses to the
/// commitment it copies. Each (run, epoch) proven takes the stake left, a wrong tensor at most
/// the run's `minStakeWei`; the first take pays the bounty and the rest of every take is burned;
/// the bounty waits until no earlier commitment can still be revealed and no tensor dispute
/// about the node is open, then `awardBounty` credits it once.
/// A wrong tensor is the one fraud the chain cannot judge (no contract runs the model): a
/// challenger opens a tensor dispute with a bond and the first jury's fees, and the Court's
/// drawn jury of re-executors rules, after the epoch settles if need be: meanwhile only the
/// worker's claims of that epoch and its stake's withdrawal are frozen. Any number of disputes
/// may run side by side on one receipt; a rejected dispute's bond goes to the worker.
contract Disputes is ReentrancyGuard {
    using HopReceipts for HopReceipt;

    enum Fraud {
        InvalidHop,
        BadTotals,
        BadSequence,
        Equivocation,
        WrongTensor,
        BadSpan
    }

    enum DisputeState {
        None,
        Open,
        Upheld, // the jury found the tensor wrong: the worker is slashed
        Rejected, // the jury found the tensor right: the bond goes to the worker
        NoJury // no jury could be drawn: the bond returns to the challenger
    }

    /// @notice A tensor dispute: a challenger's claim that a certified hop's output is not what
    /// the worker's stage computes from its input with the stage's weights at that iteration.
    /// `order` and `committedAt` are those of the challenger's commitment, by which an upheld
    /// dispute ranks for the bounty.
    struct TensorDispute {
        address challenger;
        DisputeState state;
        uint64 epoch;
        address worker;
        uint64 order;
        uint256 runId;
        uint128 bondWei;
        uint64 committedAt;
        bytes32 receiptDigest;
    }

    /// @notice A commitment to a proof: the block it was made in and its place among all
    /// commitments (from 1), by which proofs rank for a bounty.
    struct Commitment {
        uint64 blockNumber;
        uint64 order;
    }

    /// @notice The stake taken from a node and who is owed its bounty. The stake is taken at
    /// the node's first conviction, the burned part at once; `challenger` is the proven
    /// challenger with the earliest commitment so far. The bounty is final once no earlier
    /// commitment can be revealed (after block `finalAfter`) and no tensor dispute about the
    /// node is open (`openDisputes`, counted whether or not the node is convicted).
    struct Conviction {
        address challenger;
        uint64 order;
        uint32 openDisputes;
        uint64 finalAfter; // 0: not convicted
        bool awarded;
        uint128 bountyWei;
    }

    uint256 public constant BPS = 10_000;
    /// @notice The largest bounty share a deployment may set.
    uint256 public constant MAX_BOUNTY_BPS = 1_000;
    /// @notice Most hashes in the batch proof of a disputed receipt: a tree of 2^64 leaves needs
    /// no more, and the jurors (gwtf.contracts.merkle.MAX_PROOF_LENGTH) process no longer one,
    /// so a longer proof would open a dispute no juror can check.
    uint256 public constant MAX_PROOF_LENGTH = 64;

    NodeRegistry public immutable registry;
    WorkLedger public immutable ledger;
    /// @notice The court whose juries rule on tensor disputes.
    Court public immutable court;
    /// @notice The rules an invalid hop and an equivocation are judged by (deployed by this
    /// contract's constructor).
    HopRules public immutable hopRules;
    /// @notice Share of a slashed stake that goes to the challenger, in basis points.
    uint256 public immutable bountyBps;
    /// @notice What a challenger deposits to open a tensor dispute; the worker keeps it when the
    /// jury finds the tensor right (its wallet is credited), so disputing honest work costs the
    /// disputer.
    uint256 public immutable tensorBondWei;
    /// @notice Blocks after its commitment's block within which a proof must be revealed; a
    /// bounty is final this many blocks after its winner's commitment. Short enough that a
    /// cheater's accomplice cannot sit on one self-report waiting to front-run an auditor,
    /// long enough for an auditor's reveal to be mined.
    uint256 public immutable revealWindowBlocks;

    /// @notice The tensor disputes, numbered from 1.
    mapping(uint256 id => TensorDispute) public tensorDisputes;
    /// @notice The dispute a challenger opened about a receipt (0: none). Each challenger
    /// disputes a receipt once; others may dispute it side by side.
    mapping(bytes32 receiptDigest => mapping(address challenger => uint256 id)) public tensorDisputeOf;
    /// @notice How many tensor disputes were opened.
    uint256 public tensorDisputeCount;
    /// @notice Until when (a timestamp) the challenger of a dispute ruled without a jury may
    /// reopen it: the run's challenge window after the ruling or after the epoch settles,
    /// whichever is later. The worker's stake stays frozen meanwhile; 0 once reopened or
    /// released.
    mapping(uint256 id => uint256) public reopenUntil;
    /// @notice Until when (a timestamp) a dispute of the run's epoch ruled without a jury may
    /// still be reopened (the latest `reopenUntil` among them): relays keep the epoch's
    /// evidence for the jurors until then, as while a dispute is open.
    mapping(uint256 runId => mapping(uint64 epoch => uint256)) public reopenableUntil;
    /// @notice Whether a dispute reopens an earlier one (it cannot be reopened in turn).
    mapping(uint256 id => bool) public isReopening;
    /// @notice The tensor dispute of each court case.
    mapping(uint256 caseId => uint256 id) public disputeOfCase;
    /// @dev Open tensor disputes per keccak256(abi.encode(runId, epoch, worker)): the worker's
    /// claims of that epoch wait for their rulings.
    mapping(bytes32 claimKey => uint256 count) internal frozenClaims;
    /// @dev Per claim key, until when a dispute about the worker's hop of that epoch ruled
    /// without a jury may be reopened: its claims wait until then too, so that a reopened
    /// conviction still refuses its pay of the epoch.
    mapping(bytes32 claimKey => uint256) internal claimsHeldUntil;
    /// @notice Open tensor disputes per run and epoch: relays keep the epoch's evidence for
    /// the jurors until they are ruled, after the epoch settles if need be.
    mapping(uint256 runId => mapping(uint64 epoch => uint256 count)) public openTensorDisputes;

    /// @notice Each commitment (block 0: none, or revealed).
    mapping(bytes32 commitment => Commitment) public commitments;
    /// @notice How many commitments were made.
    uint64 public commitmentCount;
    /// @notice Each node's conviction.
    mapping(address node => Conviction) public convictions;
    /// @notice Certificates voided by a proof (keccak256 of the CertRef): an earlier
    /// commitment against one may still be revealed to rank for its data node's bounty.
    mapping(bytes32 certHash => bool) public voidedByProof;
    /// @notice ETH owed to an account (bounties), withdrawn with withdrawCredit.
    mapping(address account => uint256) public creditWei;
    /// @notice Slashed ETH that no account will ever withdraw.
    uint256 public burnedWei;

    event ProofCommitted(bytes32 indexed commitment, address indexed challenger, uint64 order);
    /// @notice A proof held: `slashedWei` was taken by it (0 when the node was convicted
    /// before), and `challenger` now leads for `bountyWei` (0 when an earlier commitment leads).
    event FraudProven(
        address indexed node,
        uint256 indexed runId,
        uint64 indexed epoch,
        Fraud fraud,
        address challenger,
        uint256 slashedWei,
        uint256 bountyWei,
        uint64 order
    );
    event BountyAwarded(address indexed node, address indexed challenger, uint256 bountyWei);
    event CreditWithdrawn(address indexed account, uint256 amountWei);
    event TensorDisputeOpened(
        uint256 indexed id,
        uint256 indexed runId,
        uint64 indexed epoch,
        address worker,
        address challenger,
        bytes32 receiptDigest,
        uint256 bondWei,
        HopReceipt receipt,
        BatchSignature workerSigned
    );
    event TensorDisputeReferred(uint256 indexed id, uint256 indexed caseId);
    event TensorDisputeRuled(uint256 indexed id, uint256 ruling);

    error BountyOutOfRange(uint256 bountyBps, uint256 maxBountyBps);
    error UnexpectedPayment(address sender);
    error CommitmentExists(bytes32 commitment);
    error NoCommitment(bytes32 commitment);
    error CommitmentTooRecent(bytes32 commitment, uint256 committedAt);
    error CommitmentExpired(bytes32 commitment, uint256 revealableUntil);
    error RevealWindowOutOfRange(uint256 revealWindowBlocks);
    error NotConvicted(address node);
    error BountyAwardedAlready(address node);
    error BountyNotFinal(address node, uint256 finalAfter, uint256 openDisputes);
    error ChallengePeriodOver(uint256 runId, uint64 epoch, uint256 settlesAt);
    error LeafNotInTree(address dataNode, uint64 index);
    error NotTheLeafsReceipt(uint64 index);
    error TotalsBacked(uint64 index);
    error SequenceConsistent(uint64 index, uint64 nextIndex);
    error LeavesNotAdjacent(uint64 index, uint64 nextIndex);
    error SpanNotCommitted(address worker, uint64 firstIndex, uint64 lastIndex);
    error SpanConsistent(uint64 index);
    error AlreadySlashed(address node);
    error NothingToWithdraw(address account);
    error TransferFailed(address to, uint256 amountWei);
    error WrongBond(uint256 sentWei, uint256 bondWei);
    error ReceiptNotOfCertificate(uint64 index);
    error NotWorkersSignature(address worker);
    error DisputeExists(uint256 id);
    error NotCourt(address caller);
    error NotReopenable(uint256 id);
    error BondOutOfRange(uint256 bondWei);
    error ProofTooLong(uint256 length, uint256 maxLength);

    /// @param registry_ The NodeRegistry (which names this contract its slasher).
    /// @param ledger_ The WorkLedger (which names this contract its disputes).
    /// @param court_ The Court (which names this contract its arbitrable).
    /// @param bountyBps_ Challenger's share of a slashed stake, in basis points (1..MAX_BOUNTY_BPS).
    /// @param tensorBondWei_ The bond of a tensor dispute (non-zero, below 2^128).
    /// @param revealWindowBlocks_ Blocks within which a commitment is revealed (1..2^32).
    constructor(
        NodeRegistry registry_,
        WorkLedger ledger_,
        Court court_,
        uint256 bountyBps_,
        uint256 tensorBondWei_,
        uint256 revealWindowBlocks_
    ) {
        if (bountyBps_ == 0 || bountyBps_ > MAX_BOUNTY_BPS) revert BountyOutOfRange(bountyBps_, MAX_BOUNTY_BPS);
        if (tensorBondWei_ == 0 || tensorBondWei_ > type(uint128).max) revert BondOutOfRange(tensorBondWei_);
        if (revealWindowBlocks_ == 0 || revealWindowBlocks_ > type(uint32).max) {
            revert RevealWindowOutOfRange(revealWindowBlocks_);
        }
        registry = registry_;
        ledger = ledger_;
        court = court_;
        hopRules = new HopRules(registry_, ledger_);
        bountyBps = bountyBps_;
        tensorBondWei = tensorBondWei_;
        revealWindowBlocks = revealWindowBlocks_;
    }

    /// @notice Accepts slashed stake from the registry only.
    receive() external payable {
        if (msg.sender != address(registry)) revert UnexpectedPayment(msg.sender);
    }

    /// @notice Commits to a proof before revealing it: keccak256(abi.encode(challenger, salt,
    /// proofHash)), with proofHash as the proof functions compute it. The proof may be revealed
    /// by the challenger only, in the `revealWindowBlocks` blocks after this one; it ranks for
    /// a bounty by this commitment's order. An expired commitment may be made again (anew).
    /// @param commitment The commitment.
    function commit(bytes32 commitment) external {
        uint256 committedAt = commitments[commitment].blockNumber;
        if (committedAt != 0 && block.number <= committedAt + revealWindowBlocks) {
            revert CommitmentExists(commitment);
        }
        uint64 order = ++commitmentCount;
        commitments[commitment] = Commitment(uint64(block.number), order);
        emit ProofCommitted(commitment, msg.sender, order);
    }

    // ---------------------------------------------------------------- certificate fraud

    /// @notice A leaf of a data node's certificate tree whose hop breaks a rule: a receipt for
    /// another run, epoch or data node, a stage or direction the run does not have, units off
    /// the schedule, leaf fields that do not match the receipt, a signature that is not the
    /// worker's or the counterparty's, a worker that countersigns itself, a worker that was not
    /// a bonded member of the run during the epoch, or a counterparty that was neither a bonded
    /// member nor a data node of the run during it. `receipt` and the signatures must be the
    /// leaf's (its digest and signatures hash).
    /// @param cert The accused data node's certificate.
    /// @param hop The leaf.
    /// @param proof Its Merkle proof.
    /// @param receipt The leaf's receipt.
    /// @param seal Its proof in its batch and the batch's two signatures, as the leaf commits.
    /// @param salt The challenger's salt of the commitment.
    function proveInvalidHop(
        CertRef calldata cert,
        CertifiedHop calldata hop,
        bytes32[] calldata proof,
        HopReceipt calldata receipt,
        BatchSeal calldata seal,
        bytes32 salt
    ) external nonReentrant {
        bytes32 proofHash = keccak256(abi.encode(Fraud.InvalidHop, cert, hop, proof, receipt, seal));
        Commitment memory committed = _useCommitment(proofHash, salt);
        _checkLeaf(cert, hop, proof);
        hopRules.checkInvalidHop(cert, hop, receipt, seal);
        _convictDataNode(cert, Fraud.InvalidHop, committed);
    }

    /// @notice One leaf that contradicts the certificate's count or units: a leaf beyond the
    /// count, leaf 0 with units before it, or the last leaf not ending at the total.
    /// @param cert The accused data node's certificate.
    /// @param hop The leaf.
    /// @param proof Its Merkle proof.
    /// @param salt The challenger's salt of the commitment.
    function proveBadTotals(CertRef calldata cert, CertifiedHop calldata hop, bytes32[] calldata proof, bytes32 salt)
        external
        nonReentrant
    {
        Commitment memory committed = _useCommitment(keccak256(abi.encode(Fraud.BadTotals, cert, hop, proof)), salt);
        _checkLeaf(cert, hop, proof);
        uint64 index = hop.index;
        bool contradicts = index >= cert.count || (index == 0 && hop.unitsBefore != 0)
            || (index == cert.count - 1 && uint256(hop.unitsBefore) + hop.units != cert.units);
        if (!contradicts) revert TotalsBacked(index);
        _convictDataNode(cert, Fraud.BadTotals, committed);
    }

    /// @notice Two leaves of one tree that break its sequence: two different leaves with one
    /// index, or adjacent leaves whose prefix sums do not chain or that are not strictly
    /// increasing in (worker, hopKey), the order in which each worker's hops form one range.
    /// @param cert The accused data node's certificate.
    /// @param hop A leaf at index i.
    /// @param proof Its Merkle proof.
    /// @param next A leaf at index i or i + 1.
    /// @param nextProof Its Merkle proof.
    /// @param salt The challenger's salt of the commitment.
    function proveBadSequence(
        CertRef calldata cert,
        CertifiedHop calldata hop,
        bytes32[] calldata proof,
        CertifiedHop calldata next,
        bytes32[] calldata nextProof,
        bytes32 salt
    ) external nonReentrant {
        Commitment memory committed =
            _useCommitment(keccak256(abi.encode(Fraud.BadSequence, cert, hop, proof, next, nextProof)), salt);
        _checkLeaf(cert, hop, proof);
        _checkLeaf(cert, next, nextProof);
        bool broken;
        if (next.index == hop.index) {
            broken = HopReceipts.leaf(hop) != HopReceipts.leaf(next);
        } else if (uint256(hop.index) + 1 == next.index) {
            bool ordered = hop.worker < next.worker || (hop.worker == next.worker && hop.hopKey < next.hopKey);
            broken = uint256(hop.unitsBefore) + hop.units != next.unitsBefore || !ordered;
        } else {
            revert LeavesNotAdjacent(hop.index, next.index);
        }
        if (!broken) revert SequenceConsistent(hop.index, next.index);
        _convictDataNode(cert, Fraud.BadSequence, committed);
    }

    /// @notice A span committed with the certificate that disagrees with a leaf of its tree:
    /// the leaf lies in the span and names another worker, or it is the span's last leaf and
    /// its units do not end where the span's do. Against a tree no other proof convicts (one
    /// leaf per index, sums chained, strictly sorted by worker), the spans are then its
    /// workers' ranges exactly, so a worker is always paid its own leaves.
    /// @param cert The accused data node's certificate.
    /// @param span The span, as its leaf of the range tree.
    /// @param rangeProof Its Merkle proof in the range tree.
    /// @param hop A leaf of the tree at an index of the span.
    /// @param proof Its Merkle proof.
    /// @param salt The challenger's salt of the commitment.
    function proveBadSpan(
        CertRef calldata cert,
        SpanRange calldata span,
        bytes32[] calldata rangeProof,
        CertifiedHop calldata hop,
        bytes32[] calldata proof,
        bytes32 salt
    ) external nonReentrant {
        Commitment memory committed =
            _useCommitment(keccak256(abi.encode(Fraud.BadSpan, cert, span, rangeProof, hop, proof)), salt);
        _checkLeaf(cert, hop, proof);
        bytes32 range =
            HopReceipts.rangeLeaf(span.worker, span.firstIndex, span.lastIndex, span.unitsBefore, span.unitsEnd);
        if (!MerkleProof.verifyCalldata(rangeProof, cert.rangesRoot, range)) {
            revert SpanNotCommitted(span.worker, span.firstIndex, span.lastIndex);
        }
        uint64 index = hop.index;
        bool contradicts = index >= span.firstIndex && index <= span.lastIndex
            && (hop.worker != span.worker
                || (index == span.lastIndex && uint256(hop.unitsBefore) + hop.units != span.unitsEnd));
        if (!contradicts) revert SpanConsistent(index);
        _convictDataNode(cert, Fraud.BadSpan, committed);
    }

    // ---------------------------------------------------------------- equivocation

    /// @notice Two different receipts of one hop signed by one key, in one batch or two, which
    /// is the worker of both or the counterparty of both: that node is slashed. An honest node
    /// signs and countersigns at most one receipt per hop key (a re-sent or recomputed hop is a
    /// new attempt), whatever batches it signs.
    /// @param first One receipt.
    /// @param firstSigned The signer's signature of a batch holding it, with its proof there.
    /// @param second The other receipt, with the same hop key.
    /// @param secondSigned The signer's signature of a batch holding it, with its proof there.
    /// @param salt The challenger's salt of the commitment.
    function proveEquivocation(
        HopReceipt calldata first,
        BatchSignature calldata firstSigned,
        HopReceipt calldata second,
        BatchSignature calldata secondSigned,
        bytes32 salt
    ) external nonReentrant {
        Commitment memory committed = _useCommitment(
            keccak256(abi.encode(Fraud.Equivocation, first, firstSigned, second, secondSigned)), salt
        );
        (,,, uint256 settlesAt) = ledger.epochTimes(first.runId, first.epoch);
        if (block.timestamp >= settlesAt) revert ChallengePeriodOver(first.runId, first.epoch, settlesAt);
        address signer = hopRules.equivocator(first, firstSigned, second, secondSigned);
        _convict(signer, first.runId, first.epoch, Fraud.Equivocation, msg.sender, committed, true);
    }

    // ---------------------------------------------------------------- wrong tensors

    /// @notice Disputes the output of a certified hop: the challenger says the worker's stage,
    /// with its weights at the hop's iteration, does not compute the output digest the worker
    /// signed from the input digest it signed. Takes `tensorBondWei` plus the court's first
    /// jury fees (`court.arbitrationCost()`), and opens a case in the court, whose drawn jury
    /// rules. Needs a commitment from an earlier block, like every proof, by whose order an
    /// upheld dispute ranks for the bounty, and opens before the epoch settles; the ruling may
    /// come later. Until it does, the worker's claims of the epoch in the run and its stake's
    /// withdrawal are frozen, and nothing else. Other challengers' disputes about the same
    /// receipt, lost or open, do not stand in its way; a worker convicted already is disputed
    /// only by a commitment earlier than the one leading for its bounty, before the bounty is
    /// awarded.
    /// @param cert The certificate that holds the hop.
    /// @param hop The leaf.
    /// @param proof Its Merkle proof.
    /// @param receipt The leaf's receipt.
    /// @param workerSigned The worker's signature of the batch that holds it, with its proof.
    /// @param salt The challenger's salt of the commitment.
    /// @param drawSaltHash keccak256(abi.encode(drawSalt)): the challenger's secret share of the
    /// jury's randomness, revealed to the court once the worker has answered.
    /// @return id The dispute's number.
    function openTensorDispute(
        CertRef calldata cert,
        CertifiedHop calldata hop,
        bytes32[] calldata proof,
        HopReceipt calldata receipt,
        BatchSignature calldata workerSigned,
        bytes32 salt,
        bytes32 drawSaltHash
    ) external payable nonReentrant returns (uint256 id) {
        uint256 fees = court.arbitrationCost();
        if (msg.value != tensorBondWei + fees) revert WrongBond(msg.value, tensorBondWei + fees);
        uint256 batchProofLength = workerSigned.proof.length;
        if (batchProofLength > MAX_PROOF_LENGTH) revert ProofTooLong(batchProofLength, MAX_PROOF_LENGTH);
        Commitment memory committed =
            _useCommitment(keccak256(abi.encode(Fraud.WrongTensor, cert, hop, proof, receipt, workerSigned)), salt);
        bytes32 digest = receipt.digest(address(ledger));
        uint256 prior = tensorDisputeOf[digest][msg.sender];
        // A dispute no jury could sit on is reopened by its challenger within its grace, even
        // after the epoch settled, ranking by its first commitment.
        bool reopening = prior != 0 && block.timestamp <= reopenUntil[prior];
        if (prior != 0 && !reopening) revert DisputeExists(prior);
        if (reopening) {
            reopenUntil[prior] = 0;
            committed = Commitment(tensorDisputes[prior].committedAt, tensorDisputes[prior].order);
        }
        _checkLeafAt(cert, hop, proof, reopening);
        if (hop.receiptDigest != digest) revert NotTheLeafsReceipt(hop.index);
        if (receipt.runId != cert.runId || receipt.epoch != cert.epoch || receipt.dataNode != cert.dataNode) {
            revert ReceiptNotOfCertificate(hop.index);
        }
        address worker = receipt.worker;
        if (_signer(receipt.batchDigest(digest, workerSigned.proof, address(ledger)), workerSigned.signature) != worker) {
            revert NotWorkersSignature(worker);
        }
        Conviction storage conviction = convictions[worker];
        // A worker slashed already is still disputed about an epoch it was not convicted in
        // (its pay there stands otherwise), or by a commitment that may lead for the bounty.
        if (
            conviction.finalAfter != 0 && (conviction.awarded || committed.order > conviction.order)
                && ledger.isConvictedIn(cert.runId, cert.epoch, worker)
        ) {
            revert AlreadySlashed(worker);
        }
        id = ++tensorDisputeCount;
        tensorDisputeOf[digest][msg.sender] = id;
        isReopening[id] = reopening;
        conviction.openDisputes += 1;
        frozenClaims[_claimKey(cert.runId, cert.epoch, worker)] += 1;
        openTensorDisputes[cert.runId][cert.epoch] += 1;
        tensorDisputes[id] = TensorDispute(
            msg.sender,
            DisputeState.Open,
            cert.epoch,
            worker,
            committed.order,
            cert.runId,
            uint128(tensorBondWei),
            committed.blockNumber,
            digest
        );
        (address wallet,,) = registry.bondOf(worker);
        address sponsor = ledger.getRun(cert.runId).sponsor;
        if (!reopening) registry.freezeStake(worker); // a reopening keeps its prior's freeze
        uint256 caseId =
            court.createDispute{value: fees}(Court.Parties(worker, wallet, msg.sender, sponsor, drawSaltHash));
        disputeOfCase[caseId] = id;
        // The whole receipt and signature in the event: the jurors need them, whatever
        // contract or wallet sent the transaction.
        emit TensorDisputeOpened(
            id, cert.runId, cert.epoch, worker, msg.sender, digest, tensorBondWei, receipt, workerSigned
        );
        emit TensorDisputeReferred(id, caseId);
    }

    /// @notice The court's final ruling on a dispute's case (ERC-792's `rule`). WRONG: the
    /// challenger gets its bond back and the worker is convicted, the challenger leading for
    /// the bounty if its commitment is the earliest proven (the worker's stake is taken now if
    /// no other proof took it). RIGHT: the worker's wallet gets the bond. REFUSED (no jury
    /// could be drawn): the bond returns to the challenger, who may reopen the dispute until
    /// `reopenUntil` (once; until then the worker's stake stays frozen, see
    /// releaseAfterGrace, its claims of the epoch wait and relays keep the epoch's evidence).
    /// On any other ruling the worker's claims and stake thaw. Only the court calls it.
    /// @param caseId The court's case.
    /// @param ruling Court.REFUSED, Court.RIGHT or Court.WRONG.
    function rule(uint256 caseId, uint256 ruling) external nonReentrant {
        if (msg.sender != address(court)) revert NotCourt(msg.sender);
        // The court rules each of its cases once, and only cases this contract opened.
        uint256 id = disputeOfCase[caseId];
        TensorDispute storage dispute = tensorDisputes[id];
        address worker = dispute.worker;
        emit TensorDisputeRuled(id, ruling);
        convictions[worker].openDisputes -= 1;
        frozenClaims[_claimKey(dispute.runId, dispute.epoch, worker)] -= 1;
        openTensorDisputes[dispute.runId][dispute.epoch] -= 1;
        if (ruling != 0 || isReopening[id]) registry.thawStake(worker);
        if (ruling != 2) {
            address paid = dispute.challenger;
            if (ruling == 1) {
                dispute.state = DisputeState.Rejected;
                (paid,,) = registry.bondOf(worker);
            } else {
                dispute.state = DisputeState.NoJury;
                if (!isReopening[id]) _holdForReopening(id, dispute);
            }
            creditWei[paid] += dispute.bondWei;
            return;
        }
        dispute.state = DisputeState.Upheld;
        address challenger = dispute.challenger;
        creditWei[challenger] += dispute.bondWei;
        _convict(
            worker,
            dispute.runId,
            dispute.epoch,
            Fraud.WrongTensor,
            challenger,
            Commitment(dispute.committedAt, dispute.order),
            false
        );
    }

    /// @dev Opens the grace of a first dispute ruled without a jury: until `reopenUntil`, its
    /// challenger may reopen it, the worker's stake stays frozen (the freeze is not thawed),
    /// its claims of the epoch wait and the epoch's evidence is kept.
    function _holdForReopening(uint256 id, TensorDispute storage dispute) private {
        (,,, uint256 settlesAt) = ledger.epochTimes(dispute.runId, dispute.epoch);
        uint256 from = block.timestamp > settlesAt ? block.timestamp : settlesAt;
        uint256 until = from + ledger.getRun(dispute.runId).challengeWindowS;
        reopenUntil[id] = until;
        bytes32 key = _claimKey(dispute.runId, dispute.epoch, dispute.worker);
        if (claimsHeldUntil[key] < until) claimsHeldUntil[key] = until;
        mapping(uint64 epoch => uint256) storage epochs = reopenableUntil[dispute.runId];
        if (epochs[dispute.epoch] < until) epochs[dispute.epoch] = until;
    }

    /// @notice Ends the grace of a dispute ruled without a jury and not reopened: the worker's
    /// stake thaws. Anyone may call, once the grace is over.
    /// @param id The dispute.
    function releaseAfterGrace(uint256 id) external {
        uint256 until = reopenUntil[id];
        if (until == 0 || block.timestamp <= until) revert NotReopenable(id);
        reopenUntil[id] = 0;
        registry.thawStake(tensorDisputes[id].worker);
    }

    /// @notice Whether `node`'s claims of `epoch` in `runId` wait for a court ruling (the
    /// ledger refuses them until then).
    /// @param runId The run.
    /// @param epoch The epoch.
    /// @param node The worker.
    /// @return True while a tensor dispute about its hop of that epoch is open, or one ruled
    /// without a jury may still be reopened.
    function claimsFrozen(uint256 runId, uint64 epoch, address node) external view returns (bool) {
        bytes32 key = _claimKey(runId, epoch, node);
        return frozenClaims[key] != 0 || block.timestamp <= claimsHeldUntil[key];
    }

    /// @notice Credits a convicted node's bounty to the proven challenger whose commitment came
    /// first, once that is final: no earlier commitment can be revealed any more (its window
    /// closed after block `finalAfter`) and no tensor dispute about the node is open. Anyone
    /// may call it; the bounty is credited once.
    /// @param node The convicted node.
    function awardBounty(address node) external nonReentrant {
        Conviction storage conviction = convictions[node];
        if (conviction.finalAfter == 0) revert NotConvicted(node);
        if (conviction.awarded) revert BountyAwardedAlready(node);
        if (block.number <= conviction.finalAfter || conviction.openDisputes != 0) {
            revert BountyNotFinal(node, conviction.finalAfter, conviction.openDisputes);
        }
        conviction.awarded = true;
        address challenger = conviction.challenger;
        uint256 bountyWei = conviction.bountyWei;
        creditWei[challenger] += bountyWei;
        emit BountyAwarded(node, challenger, bountyWei);
    }

    /// @notice Sends the caller the bounties (and dispute bonds) credited to it.
    function withdrawCredit() external nonReentrant {
        uint256 amount = creditWei[msg.sender];
        if (amount == 0) revert NothingToWithdraw(msg.sender);
        creditWei[msg.sender] = 0;
        emit CreditWithdrawn(msg.sender, amount);
        (bool ok,) = msg.sender.call{value: amount}("");
        if (!ok) revert TransferFailed(msg.sender, amount);
    }

    /// @notice The commitment a challenger makes for a proof.
    /// @param challenger Who will reveal the proof.
    /// @param salt A secret of the challenger's.
    /// @param proofHash The proof's hash, as the proof function computes it.
    /// @return The commitment.
    function commitmentOf(address challenger, bytes32 salt, bytes32 proofHash) public pure returns (bytes32) {
        return keccak256(abi.encode(challenger, salt, proofHash));
    }

    // ---------------------------------------------------------------- internals

    function _claimKey(uint256 runId, uint64 epoch, address node) private pure returns (bytes32) {
        return keccak256(abi.encode(runId, epoch, node));
    }

    /// @dev The caller's commitment to the proof, from an earlier block and within the reveal
    /// window; used up.
    function _useCommitment(bytes32 proofHash, bytes32 salt) private returns (Commitment memory committed) {
        bytes32 commitment = commitmentOf(msg.sender, salt, proofHash);
        committed = commitments[commitment];
        uint256 committedAt = committed.blockNumber;
        if (committedAt == 0) revert NoCommitment(commitment);
        if (committedAt >= block.number) revert CommitmentTooRecent(commitment, committedAt);
        if (block.number > committedAt + revealWindowBlocks) {
            revert CommitmentExpired(commitment, committedAt + revealWindowBlocks);
        }
        delete commitments[commitment];
    }

    /// @dev The leaf is in the certificate's tree, the certificate is open (or voided by a
    /// proof, against which an earlier commitment may still rank) and it is judged before the
    /// epoch settles.
    function _checkLeaf(CertRef calldata cert, CertifiedHop calldata hop, bytes32[] calldata proof) private view {
        _checkLeafAt(cert, hop, proof, false);
    }

    /// @dev `anyTime`: past the epoch's challenge period too (a reopened dispute).
    function _checkLeafAt(CertRef calldata cert, CertifiedHop calldata hop, bytes32[] calldata proof, bool anyTime)
        private
        view
    {
        (,,, uint256 settlesAt) = ledger.epochTimes(cert.runId, cert.epoch);
        if (!anyTime && block.timestamp >= settlesAt) revert ChallengePeriodOver(cert.runId, cert.epoch, settlesAt);
        if (!voidedByProof[keccak256(abi.encode(cert))]) ledger.checkCertificate(cert);
        if (!MerkleProof.verifyCalldata(proof, cert.root, HopReceipts.leaf(hop))) {
            revert LeafNotInTree(cert.dataNode, hop.index);
        }
    }

    function _signer(bytes32 digest, bytes calldata signature) private pure returns (address) {
        (address signer, ECDSA.RecoverError failure,) = ECDSA.tryRecover(digest, signature);
        return failure == ECDSA.RecoverError.NoError ? signer : address(0);
    }

    /// @dev Voids the tree unless a proof voided it before, and convicts its data node. A data
    /// node convicted before still has a further fraudulent tree voided (its proof leads for
    /// no bounty); a proof against a voided tree must take the lead, or it changes nothing.
    function _convictDataNode(CertRef calldata cert, Fraud fraud, Commitment memory committed) private {
        bytes32 certHash = keccak256(abi.encode(cert));
        bool voided = voidedByProof[certHash];
        if (!voided) {
            voidedByProof[certHash] = true;
            ledger.voidCertificate(cert);
        }
        _convict(cert.dataNode, cert.runId, cert.epoch, fraud, msg.sender, committed, voided);
    }

    /// @dev Convicts `node` on `challenger`'s proof of a fault in (run, epoch). The ledger
    /// records every (run, epoch) a node is proven at fault in, where its pay is burned; its
    /// other work stands. Each (run, epoch) newly proven takes its part of the stake (it
    /// arrives from the trusted registry): a wrong tensor at most the run's `minStakeWei`,
    /// certificate fraud and equivocation all that is left. The first conviction's take sets
    /// the bounty, held for the leader; a later proof with an earlier commitment takes the lead
    /// until the bounty is awarded; every other take is burned. A proof that can neither lead
    /// nor convict the node in a further epoch reverts when `mustLead`, else leads for nothing.
    function _convict(
        address node,
        uint256 runId,
        uint64 epoch,
        Fraud fraud,
        address challenger,
        Commitment memory committed,
        bool mustLead
    ) private {
        bool newEpoch = ledger.recordConviction(runId, epoch, node);
        Conviction storage conviction = convictions[node];
        uint64 order = committed.order;
        bool first = conviction.finalAfter == 0;
        uint256 slashedWei = 0;
        if (newEpoch || first) {
            uint256 cap = fraud == Fraud.WrongTensor ? ledger.getRun(runId).minStakeWei : type(uint256).max;
            slashedWei = registry.slashUpTo(node, cap);
        }
        if (!first && (conviction.awarded || order > conviction.order)) {
            if (mustLead && !newEpoch) revert AlreadySlashed(node);
            burnedWei += slashedWei;
            emit FraudProven(node, runId, epoch, fraud, challenger, slashedWei, 0, order);
            return;
        }
        conviction.challenger = challenger;
        conviction.order = order;
        conviction.finalAfter = uint64(committed.blockNumber + revealWindowBlocks);
        uint256 bountyWei = conviction.bountyWei;
        if (first) {
            bountyWei = slashedWei * bountyBps / BPS;
            conviction.bountyWei = uint128(bountyWei);
            burnedWei += slashedWei - bountyWei;
        } else {
            burnedWei += slashedWei;
        }
        emit FraudProven(node, runId, epoch, fraud, challenger, slashedWei, bountyWei, order);
    }
}
