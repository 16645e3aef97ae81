// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.28;

import {EIP712} from "@openzeppelin/contracts/utils/cryptography/EIP712.sol";
import {ECDSA} from "@openzeppelin/contracts/utils/cryptography/ECDSA.sol";
import {MerkleProof} from "@openzeppelin/contracts/utils/cryptography/MerkleProof.sol";
import {HopReceipt, HopReceipts, LeafProof} from "./HopReceipts.sol";
import {NodeRegistry} from "./NodeRegistry.sol";
import {RunBook} from "./RunBook.sol";

/// @title WorkLedger
/// @notice Per run and epoch, each node commits the Merkle root of its hop receipts with their
/// count and units. Until the epoch settles anyone may prove fraud that the chain judges alone;
/// a valid proof slashes the node's stake (a bounty to the challenger, the rest to the run's pool)
/// and voids its claim. After that, the epoch's budget is paid pro rata to the surviving units,
/// by pull.
/// @dev A claim is stored as one slot, keccak256(abi.encode(root, count, units)); callers pass the
/// claim (from the EpochRootSubmitted event) and the ledger checks it against that commitment.
contract WorkLedger is RunBook, EIP712 {
    using HopReceipts for HopReceipt;

    /// @notice A node's claim for one epoch, as submitted.
    struct ClaimRef {
        uint256 runId;
        uint64 epoch;
        address node;
        bytes32 root;
        uint64 count;
        uint64 units;
    }

    /// @dev One slot per run and epoch: written by every submission, so the first root of an epoch
    /// pays for one new slot and later ones for an update.
    struct EpochBook {
        uint96 openUnits; // units of claims neither voided nor paid
        uint128 unpaidBudgetWei; // budget not yet paid out
        bool budgetFixed;
    }

    struct IndexChallenge {
        address challenger;
        uint40 deadline;
        uint96 bondWei;
    }

    enum Fraud {
        BadCountersignature,
        DoubleClaim,
        OffSchedule,
        WrongWorker,
        UnbackedTotal,
        BrokenChain,
        Unrevealed
    }

    bytes32 internal constant VOIDED = bytes32(uint256(1));
    bytes32 internal constant PAID = bytes32(uint256(2));
    uint256 public constant BPS = 10_000;

    /// @notice Share of a slashed stake that goes to the challenger, in basis points.
    uint256 public immutable bountyBps;
    /// @notice Bond that opening an index challenge costs; it pays the node's reveal if answered.
    uint256 public immutable indexChallengeBondWei;

    mapping(uint256 runId => mapping(uint64 epoch => mapping(address node => bytes32))) internal _claims;
    mapping(uint256 runId => mapping(uint64 epoch => EpochBook)) internal _books;
    mapping(bytes32 challengeKey => IndexChallenge) internal _indexChallenges;
    mapping(uint256 runId => mapping(uint64 epoch => mapping(address node => uint256))) public
        openChallenges;
    /// @notice ETH owed to an account (bounties, bonds), withdrawn with withdrawCredit.
    mapping(address account => uint256) public creditWei;

    event EpochRootSubmitted(
        uint256 indexed runId, uint64 indexed epoch, address indexed node, bytes32 root, uint64 count, uint64 units
    );
    event EpochBudgetFixed(uint256 indexed runId, uint64 indexed epoch, uint256 budgetWei);
    event FraudProven(
        uint256 indexed runId,
        uint64 indexed epoch,
        address indexed node,
        Fraud fraud,
        address challenger,
        uint256 slashedWei,
        uint256 bountyWei
    );
    event IndexChallengeOpened(
        uint256 indexed runId, uint64 indexed epoch, address indexed node, uint64 index, address challenger, uint256 deadline
    );
    event LeafRevealed(
        uint256 indexed runId,
        uint64 indexed epoch,
        address indexed node,
        uint64 index,
        uint64 unitsBefore,
        HopReceipt receipt,
        bytes counterpartySignature
    );
    event IndexChallengeDropped(uint256 indexed runId, uint64 indexed epoch, address indexed node, uint64 index);
    event RewardClaimed(
        uint256 indexed runId, uint64 indexed epoch, address indexed node, address wallet, uint256 amountWei
    );
    event CreditWithdrawn(address indexed account, uint256 amountWei);

    error BountyTooLarge(uint256 bountyBps);
    error UnexpectedPayment(address sender);
    error SubmissionClosed(uint256 runId, uint64 epoch, uint256 opensAt, uint256 closesAt);
    error EpochAfterClose(uint256 runId, uint64 epoch, uint64 lastEpoch);
    error NotRunMember(uint256 runId, address node);
    error NodeNotBonded(address node);
    error EmptyClaim();
    error UnitsOutOfRange(uint256 units, uint256 minUnits, uint256 maxUnits);
    error ClaimAlreadySubmitted(uint256 runId, uint64 epoch, address node);
    error ClaimNotOpen(uint256 runId, uint64 epoch, address node);
    error ClaimMismatch(uint256 runId, uint64 epoch, address node);
    error ChallengePeriodOver(uint256 runId, uint64 epoch, uint256 endedAt);
    error LeafNotInTree(address node, uint64 index);
    error CountersignatureValid(address counterparty);
    error NotSameHop();
    error SameLeaf();
    error ReceiptOnSchedule();
    error WorkerMatches(address node);
    error TotalBacked(uint64 index);
    error LeavesNotAdjacent(uint64 index, uint64 nextIndex);
    error ChainConsistent(uint64 index);
    error IndexOutOfRange(uint64 index, uint64 count);
    error WrongBond(uint256 sentWei, uint256 requiredWei);
    error ChallengeAlreadyOpen(uint64 index);
    error NoChallengeOpen(uint64 index);
    error RevealTooLate(uint64 index, uint256 deadline);
    error RevealNotDue(uint64 index, uint256 deadline);
    error NotSettled(uint256 runId, uint64 epoch, uint256 settlesAt);
    error ChallengesOpen(uint256 runId, uint64 epoch, address node, uint256 open);

    /// @param registry_ The NodeRegistry whose stakes back the claims.
    /// @param revealPeriodS_ Seconds a node has to answer an index challenge.
    /// @param indexChallengeBondWei_ Bond for opening an index challenge.
    /// @param bountyBps_ Challenger's share of a slashed stake, in basis points.
    constructor(
        NodeRegistry registry_,
        uint256 revealPeriodS_,
        uint256 indexChallengeBondWei_,
        uint256 bountyBps_
    ) RunBook(registry_, revealPeriodS_) EIP712("GWTF Ledger", "1") {
        if (bountyBps_ > BPS) revert BountyTooLarge(bountyBps_);
        if (indexChallengeBondWei_ > type(uint96).max) revert WrongBond(indexChallengeBondWei_, 0);
        bountyBps = bountyBps_;
        indexChallengeBondWei = indexChallengeBondWei_;
    }

    /// @notice Accepts slashed stake from the registry only.
    receive() external payable {
        if (msg.sender != address(registry)) revert UnexpectedPayment(msg.sender);
    }

    // ---------------------------------------------------------------- claims

    /// @notice Commits a node's receipts for a finished epoch. Node's wallet only, once per epoch,
    /// during the epoch's submission period. The first root of an epoch fixes its budget
    /// (rewardPerEpoch, capped by the run's funds).
    /// @param runId The run.
    /// @param epoch The finished epoch.
    /// @param node The node whose receipts the tree holds.
    /// @param root The Merkle root of the receipt leaves.
    /// @param count Number of leaves (indices 0..count-1).
    /// @param units Sum of the receipts' units.
    function submitEpochRoot(
        uint256 runId,
        uint64 epoch,
        address node,
        bytes32 root,
        uint64 count,
        uint64 units
    ) external {
        Run storage run = _existingRun(runId);
        if (epoch > run.lastEpoch) revert EpochAfterClose(runId, epoch, run.lastEpoch);
        uint256 opensAt = uint256(run.startTime) + (uint256(epoch) + 1) * run.epochLengthS;
        if (block.timestamp < opensAt || block.timestamp >= opensAt + run.epochLengthS) {
            revert SubmissionClosed(runId, epoch, opensAt, opensAt + run.epochLengthS);
        }
        if (count == 0) revert EmptyClaim();
        uint256 minUnits = uint256(count) * run.unitsPerHop;
        if (units < minUnits || units > 2 * minUnits) revert UnitsOutOfRange(units, minUnits, 2 * minUnits);
        _checkBond(run, node, opensAt);
        if (!_membership[runId][node].joined) revert NotRunMember(runId, node);
        mapping(address => bytes32) storage epochClaims = _claims[runId][epoch];
        if (epochClaims[node] != bytes32(0)) revert ClaimAlreadySubmitted(runId, epoch, node);

        epochClaims[node] = keccak256(abi.encode(root, count, units));
        EpochBook storage book = _books[runId][epoch];
        // Checked: a uint96 sum holds 2^32 maximal uint64 claims before it would revert.
        book.openUnits += uint96(units);
        if (!book.budgetFixed) _fixBudget(run, book, runId, epoch);
        emit EpochRootSubmitted(runId, epoch, node, root, count, units);
    }

    /// @notice Pays the node's wallet its pro-rata share of the epoch's budget: the unpaid budget
    /// times its units over the unpaid units, so rounding dust ends with the last claimant and
    /// the budget is paid exactly. Node's wallet only, once, after the epoch settles.
    /// @param claim The claim, as submitted.
    function claimReward(ClaimRef calldata claim) external nonReentrant {
        (address wallet,,,) = registry.bondOf(claim.node);
        if (wallet != msg.sender) revert NotNodeWallet(claim.node, msg.sender);
        (,,, uint256 settlesAt) = epochTimes(claim.runId, claim.epoch);
        if (block.timestamp < settlesAt) revert NotSettled(claim.runId, claim.epoch, settlesAt);
        _checkClaim(claim);
        uint256 open = openChallenges[claim.runId][claim.epoch][claim.node];
        if (open != 0) revert ChallengesOpen(claim.runId, claim.epoch, claim.node, open);

        _claims[claim.runId][claim.epoch][claim.node] = PAID;
        EpochBook storage book = _books[claim.runId][claim.epoch];
        uint256 amount = uint256(book.unpaidBudgetWei) * claim.units / book.openUnits;
        book.unpaidBudgetWei -= uint128(amount);
        book.openUnits -= uint96(claim.units);
        emit RewardClaimed(claim.runId, claim.epoch, claim.node, msg.sender, amount);
        if (amount != 0) _send(msg.sender, amount);
    }

    /// @notice Sends the caller the ETH credited to it (bounties, returned or earned bonds).
    function withdrawCredit() external nonReentrant {
        uint256 amount = creditWei[msg.sender];
        if (amount == 0) revert NothingToWithdraw(msg.sender);
        creditWei[msg.sender] = 0;
        emit CreditWithdrawn(msg.sender, amount);
        _send(msg.sender, amount);
    }

    // ---------------------------------------------------------------- fraud proofs

    /// @notice (a) A leaf whose countersignature is not a valid EIP-712 signature, by the receipt's
    /// counterparty, of a node that joined the run (and not the worker itself).
    /// @param claim The accused claim.
    /// @param leaf The leaf, with its signature and proof.
    function proveBadCountersignature(ClaimRef calldata claim, LeafProof calldata leaf) external {
        bytes32 digest = _checkProof(claim, leaf);
        HopReceipt calldata receipt = leaf.receipt;
        (address signer, ECDSA.RecoverError failure,) = ECDSA.tryRecover(digest, leaf.counterpartySignature);
        bool valid = failure == ECDSA.RecoverError.NoError && signer == receipt.counterparty
            && signer != receipt.worker && _membership[claim.runId][signer].joined;
        if (valid) revert CountersignatureValid(signer);
        _convict(claim, msg.sender, Fraud.BadCountersignature);
    }

    /// @notice (b) The same hop (run, epoch, microbatch, stage, direction, attempt) in two
    /// different leaves, of one tree or of two nodes' trees. In two trees the chain cannot tell the
    /// genuine copy, so both claims are voided and both nodes slashed.
    /// @param first One claim and leaf.
    /// @param firstLeaf Its leaf.
    /// @param second The other claim (may be the same claim) and leaf.
    /// @param secondLeaf Its leaf.
    function proveDoubleClaim(
        ClaimRef calldata first,
        LeafProof calldata firstLeaf,
        ClaimRef calldata second,
        LeafProof calldata secondLeaf
    ) external {
        _checkProof(first, firstLeaf);
        _checkProof(second, secondLeaf);
        if (firstLeaf.receipt.hopKey() != secondLeaf.receipt.hopKey()) revert NotSameHop();
        bool sameTree = first.node == second.node && first.runId == second.runId && first.epoch == second.epoch;
        if (sameTree && _leafOf(firstLeaf) == _leafOf(secondLeaf)) revert SameLeaf();
        _convict(first, msg.sender, Fraud.DoubleClaim);
        if (!sameTree) _convict(second, msg.sender, Fraud.DoubleClaim);
    }

    /// @notice (c) A leaf whose receipt is not for this run and epoch, or names a stage or direction
    /// the run does not have, or units other than the run's schedule.
    /// @param claim The accused claim.
    /// @param leaf The leaf.
    function proveOffSchedule(ClaimRef calldata claim, LeafProof calldata leaf) external {
        _checkProof(claim, leaf);
        HopReceipt calldata receipt = leaf.receipt;
        Run storage run = _runs[claim.runId];
        bool onSchedule = receipt.runId == claim.runId && receipt.epoch == claim.epoch
            && receipt.stage < run.stageCount && receipt.direction <= HopReceipts.BACKWARD
            && receipt.units == HopReceipts.scheduledUnits(receipt.direction, run.unitsPerHop);
        if (onSchedule) revert ReceiptOnSchedule();
        _convict(claim, msg.sender, Fraud.OffSchedule);
    }

    /// @notice (d) A leaf in a node's tree whose worker is not that node.
    /// @param claim The accused claim.
    /// @param leaf The leaf.
    function proveWrongWorker(ClaimRef calldata claim, LeafProof calldata leaf) external {
        _checkProof(claim, leaf);
        if (leaf.receipt.worker == claim.node) revert WorkerMatches(claim.node);
        _convict(claim, msg.sender, Fraud.WrongWorker);
    }

    /// @notice (e) One leaf that contradicts the claimed count or units: leaf 0 with units before
    /// it, the last leaf not ending at the claimed units, or a leaf beyond the claimed count.
    /// @param claim The accused claim.
    /// @param leaf The leaf.
    function proveUnbackedTotal(ClaimRef calldata claim, LeafProof calldata leaf) external {
        _checkProof(claim, leaf);
        uint64 index = leaf.index;
        bool contradicts = index >= claim.count || (index == 0 && leaf.unitsBefore != 0)
            || (index == claim.count - 1 && uint256(leaf.unitsBefore) + leaf.receipt.units != claim.units);
        if (!contradicts) revert TotalBacked(index);
        _convict(claim, msg.sender, Fraud.UnbackedTotal);
    }

    /// @notice (e) Two adjacent leaves whose prefix sums do not chain
    /// (unitsBefore[i] + units[i] != unitsBefore[i+1]).
    /// @param claim The accused claim.
    /// @param leaf The leaf at index i.
    /// @param next The leaf at index i+1.
    function proveBrokenChain(ClaimRef calldata claim, LeafProof calldata leaf, LeafProof calldata next)
        external
    {
        _checkProof(claim, leaf);
        _checkProof(claim, next);
        if (uint256(leaf.index) + 1 != next.index) revert LeavesNotAdjacent(leaf.index, next.index);
        if (uint256(leaf.unitsBefore) + leaf.receipt.units == next.unitsBefore) {
            revert ChainConsistent(leaf.index);
        }
        _convict(claim, msg.sender, Fraud.BrokenChain);
    }

    // ---------------------------------------------------------------- index challenges

    /// @notice Demands that the node reveal the leaf at `index` of its tree within the reveal
    /// period, against a bond of indexChallengeBondWei (paid to the node if it answers, returned
    /// with a bounty if it does not).
    /// @param claim The challenged claim.
    /// @param index The leaf index demanded (< count).
    function openIndexChallenge(ClaimRef calldata claim, uint64 index) external payable {
        (,, uint256 challengeEndsAt,) = epochTimes(claim.runId, claim.epoch);
        if (block.timestamp >= challengeEndsAt) {
            revert ChallengePeriodOver(claim.runId, claim.epoch, challengeEndsAt);
        }
        _checkClaim(claim);
        if (index >= claim.count) revert IndexOutOfRange(index, claim.count);
        if (msg.value != indexChallengeBondWei) revert WrongBond(msg.value, indexChallengeBondWei);
        IndexChallenge storage challenge = _indexChallenges[_challengeKey(claim, index)];
        if (challenge.challenger != address(0)) revert ChallengeAlreadyOpen(index);
        uint256 deadline = block.timestamp + revealPeriodS;
        challenge.challenger = msg.sender;
        challenge.deadline = uint40(deadline);
        challenge.bondWei = uint96(msg.value);
        openChallenges[claim.runId][claim.epoch][claim.node] += 1;
        emit IndexChallengeOpened(claim.runId, claim.epoch, claim.node, index, msg.sender, deadline);
    }

    /// @notice Answers an index challenge with the leaf and its proof; the bond is credited to the
    /// node's wallet. Anyone may call; the leaf is published in LeafRevealed for auditors.
    /// @param claim The challenged claim.
    /// @param leaf The leaf at the demanded index.
    function revealLeaf(ClaimRef calldata claim, LeafProof calldata leaf) external {
        bytes32 key = _challengeKey(claim, leaf.index);
        IndexChallenge memory challenge = _indexChallenges[key];
        if (challenge.challenger == address(0)) revert NoChallengeOpen(leaf.index);
        if (block.timestamp > challenge.deadline) revert RevealTooLate(leaf.index, challenge.deadline);
        _checkClaim(claim);
        _checkLeaf(claim, leaf);
        delete _indexChallenges[key];
        openChallenges[claim.runId][claim.epoch][claim.node] -= 1;
        (address wallet,,,) = registry.bondOf(claim.node);
        creditWei[wallet] += challenge.bondWei;
        emit LeafRevealed(
            claim.runId, claim.epoch, claim.node, leaf.index, leaf.unitsBefore, leaf.receipt, leaf.counterpartySignature
        );
    }

    /// @notice After an unanswered challenge's deadline: slashes the node and voids its claim
    /// (data it cannot show counts as fraud); the bond returns to the challenger. If the claim
    /// was already voided by another proof, only the bond returns.
    /// @param claim The challenged claim.
    /// @param index The demanded index.
    function slashUnrevealed(ClaimRef calldata claim, uint64 index) external {
        bytes32 key = _challengeKey(claim, index);
        IndexChallenge memory challenge = _indexChallenges[key];
        if (challenge.challenger == address(0)) revert NoChallengeOpen(index);
        if (block.timestamp <= challenge.deadline) revert RevealNotDue(index, challenge.deadline);
        delete _indexChallenges[key];
        openChallenges[claim.runId][claim.epoch][claim.node] -= 1;
        creditWei[challenge.challenger] += challenge.bondWei;
        if (_claims[claim.runId][claim.epoch][claim.node] == VOIDED) {
            emit IndexChallengeDropped(claim.runId, claim.epoch, claim.node, index);
            return;
        }
        _checkClaim(claim);
        _convict(claim, challenge.challenger, Fraud.Unrevealed);
    }

    // ---------------------------------------------------------------- views

    /// @notice The EIP-712 digest a counterparty signs for `receipt` (binds chain id and this
    /// ledger's address).
    /// @param receipt The receipt.
    /// @return The digest.
    function receiptDigest(HopReceipt calldata receipt) public view returns (bytes32) {
        return _hashTypedDataV4(receipt.structHash());
    }

    /// @notice The tree leaf for a receipt at `index` with `unitsBefore` and its countersignature.
    /// @param leaf The leaf data (its proof is ignored).
    /// @return The leaf hash.
    function leafHash(LeafProof calldata leaf) external view returns (bytes32) {
        return _leafOf(leaf);
    }

    /// @notice The stored commitment of a claim: 0 none, 1 voided, 2 paid, else
    /// keccak256(abi.encode(root, count, units)).
    /// @param runId The run.
    /// @param epoch The epoch.
    /// @param node The node.
    /// @return The commitment.
    function claimCommitment(uint256 runId, uint64 epoch, address node) external view returns (bytes32) {
        return _claims[runId][epoch][node];
    }

    /// @notice The epoch's open units and unpaid budget.
    /// @param runId The run.
    /// @param epoch The epoch.
    /// @return The book.
    function epochBook(uint256 runId, uint64 epoch) external view returns (EpochBook memory) {
        return _books[runId][epoch];
    }

    /// @notice An open index challenge (challenger zero when none).
    /// @param claim The claim (only runId, epoch and node are read).
    /// @param index The leaf index.
    /// @return The challenge.
    function indexChallenge(ClaimRef calldata claim, uint64 index) external view returns (IndexChallenge memory) {
        return _indexChallenges[_challengeKey(claim, index)];
    }

    // ---------------------------------------------------------------- internals

    function _checkBond(Run storage run, address node, uint256 epochEndsAt) private view {
        (address wallet, uint256 stakeWei, NodeRegistry.NodeStatus status, uint256 unlockAt) = registry.bondOf(node);
        if (wallet != msg.sender) revert NotNodeWallet(node, msg.sender);
        // A node that started unbonding after the epoch began worked in it while active; its
        // stake stays locked long enough (see RunBook._checkConfig) to answer for the claim.
        bool bonded = status == NodeRegistry.NodeStatus.Active
            || (status == NodeRegistry.NodeStatus.Unbonding
                && unlockAt - registry.unbondingDelayS() + run.epochLengthS >= epochEndsAt);
        if (!bonded) revert NodeNotBonded(node);
        if (stakeWei < run.minStakeWei) revert StakeBelowRunMinimum(node, stakeWei, run.minStakeWei);
    }

    function _fixBudget(Run storage run, EpochBook storage book, uint256 runId, uint64 epoch) private {
        uint128 budget = run.rewardPerEpochWei < run.availableWei ? run.rewardPerEpochWei : run.availableWei;
        run.availableWei -= budget;
        book.unpaidBudgetWei = budget;
        book.budgetFixed = true;
        emit EpochBudgetFixed(runId, epoch, budget);
    }

    function _checkClaim(ClaimRef calldata claim) private view {
        bytes32 stored = _claims[claim.runId][claim.epoch][claim.node];
        if (stored == bytes32(0) || stored == VOIDED || stored == PAID) {
            revert ClaimNotOpen(claim.runId, claim.epoch, claim.node);
        }
        if (stored != keccak256(abi.encode(claim.root, claim.count, claim.units))) {
            revert ClaimMismatch(claim.runId, claim.epoch, claim.node);
        }
    }

    /// @dev A fraud proof is judged only against a live claim, before the epoch settles, for a
    /// leaf that is in the claim's tree; returns the receipt's digest.
    function _checkProof(ClaimRef calldata claim, LeafProof calldata leaf) private view returns (bytes32) {
        (,,, uint256 settlesAt) = epochTimes(claim.runId, claim.epoch);
        if (block.timestamp >= settlesAt) revert ChallengePeriodOver(claim.runId, claim.epoch, settlesAt);
        _checkClaim(claim);
        return _checkLeaf(claim, leaf);
    }

    function _checkLeaf(ClaimRef calldata claim, LeafProof calldata leaf) private view returns (bytes32 digest) {
        digest = receiptDigest(leaf.receipt);
        bytes32 leafHash_ = HopReceipts.leaf(digest, leaf.index, leaf.unitsBefore, leaf.counterpartySignature);
        if (!MerkleProof.verifyCalldata(leaf.proof, claim.root, leafHash_)) {
            revert LeafNotInTree(claim.node, leaf.index);
        }
    }

    function _leafOf(LeafProof calldata leaf) private view returns (bytes32) {
        return HopReceipts.leaf(receiptDigest(leaf.receipt), leaf.index, leaf.unitsBefore, leaf.counterpartySignature);
    }

    /// @dev Voids the claim, slashes the node and shares the stake between the challenger and the
    /// run's pool. Slashed ETH arrives from the registry (trusted) before the credits are written.
    function _convict(ClaimRef calldata claim, address challenger, Fraud fraud) private {
        _claims[claim.runId][claim.epoch][claim.node] = VOIDED;
        Run storage run = _runs[claim.runId];
        EpochBook storage book = _books[claim.runId][claim.epoch];
        book.openUnits -= uint96(claim.units);
        if (book.openUnits == 0 && book.unpaidBudgetWei != 0) {
            // Nobody is left to pay in this epoch: its budget returns to the pool.
            _creditRun(run, book.unpaidBudgetWei);
            book.unpaidBudgetWei = 0;
        }
        uint256 slashedWei = registry.slash(claim.node);
        uint256 bountyWei = slashedWei * bountyBps / BPS;
        creditWei[challenger] += bountyWei;
        _creditRun(run, slashedWei - bountyWei);
        emit FraudProven(claim.runId, claim.epoch, claim.node, fraud, challenger, slashedWei, bountyWei);
    }

    function _challengeKey(ClaimRef calldata claim, uint64 index) private pure returns (bytes32) {
        return keccak256(abi.encode(claim.runId, claim.epoch, claim.node, index));
    }
}
