// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.28;

import {ReentrancyGuard} from "@openzeppelin/contracts/utils/ReentrancyGuard.sol";
import {NodeRegistry} from "./NodeRegistry.sol";

/// @title RunBook
/// @notice Training runs: a sponsor opens a run with its schedule and reward budget, names its
/// data nodes, funds and closes it; staked relays join and leave it. The work ledger (which
/// extends this contract) keeps the run's funds here, so rewards and refunds move within one
/// balance sheet. Membership and data-node times are written once each, so whether a node took
/// part in a past epoch never changes.
abstract contract RunBook is ReentrancyGuard {
    /// @notice What a sponsor fixes when opening a run.
    struct RunConfig {
        bytes32 modelConfigHash;
        bytes32 datasetHash;
        uint16 stageCount;
        uint32 epochLengthS;
        uint64 unitsPerHop;
        uint128 rewardPerEpochWei;
        uint32 challengeWindowS;
        uint96 minStakeWei;
        uint128 hopPriceWei;
    }

    /// @dev Packed so that accepting a certificate reads four slots: slot 0 (sponsor, timing,
    /// state), slot 1 (funds), slot 2 (schedule) and slot 5 (price). `hopPriceWei` is what a
    /// certified hop of `unitsPerHop` units earns (a backward, twice the units, earns twice);
    /// `rewardPerEpochWei` caps what one epoch's certificates may reserve.
    struct Run {
        address sponsor;
        uint40 startTime;
        uint32 epochLengthS;
        uint16 stageCount;
        bool closed;
        uint128 availableWei;
        uint128 rewardPerEpochWei;
        uint64 unitsPerHop;
        uint96 minStakeWei;
        uint64 lastEpoch;
        uint32 challengeWindowS;
        bytes32 modelConfigHash;
        bytes32 datasetHash;
        uint128 hopPriceWei;
    }

    struct Membership {
        uint40 joinedAt; // 0 until it joins; a node joins a run once
        uint40 leftAt; // 0 until it leaves
        uint32 positionPlusOne; // 1-based position in the member list, 0 when not a member now
    }

    uint256 public constant MAX_STAGES = 1024;
    uint256 public constant MAX_EPOCH_LENGTH_S = 30 days;
    /// @notice The shortest challenge window: time to fetch a tree, check it and commit to a
    /// proof a block before revealing it.
    uint256 public constant MIN_CHALLENGE_WINDOW_S = 600;
    uint256 public constant MAX_RUN_PAGE = 100;
    uint64 internal constant OPEN_ENDED = type(uint64).max;

    NodeRegistry public immutable registry;

    uint256 public runCount;
    mapping(uint256 runId => Run) internal _runs;
    mapping(uint256 runId => address[]) internal _members;
    mapping(uint256 runId => mapping(address node => Membership)) internal _membership;
    mapping(uint256 runId => mapping(address node => uint40 since)) internal _dataNodeSince;

    event RunOpened(uint256 indexed runId, address indexed sponsor, RunConfig config, uint256 fundedWei);
    event RunFunded(uint256 indexed runId, address indexed funder, uint256 amountWei, uint256 availableWei);
    event RunClosed(uint256 indexed runId, uint64 lastEpoch, uint256 refundableAt);
    event RefundWithdrawn(uint256 indexed runId, address indexed sponsor, uint256 amountWei);
    event DataNodeAdded(uint256 indexed runId, address indexed node);
    event RunJoined(uint256 indexed runId, address indexed node);
    event RunLeft(uint256 indexed runId, address indexed node);

    error UnknownRun(uint256 runId);
    error NotSponsor(uint256 runId, address caller);
    error RunIsClosed(uint256 runId);
    error RunNotClosed(uint256 runId);
    error RefundNotYet(uint256 runId, uint256 refundableAt, uint256 nowS);
    error NothingToWithdraw(address account);
    error ZeroAmount();
    error FundsOverflow(uint256 availableWei);
    error StageCountOutOfRange(uint256 stageCount, uint256 maxStages);
    error EpochLengthOutOfRange(uint256 epochLengthS, uint256 maxEpochLengthS);
    error ChallengeWindowTooShort(uint256 challengeWindowS, uint256 minChallengeWindowS);
    error UnitsPerHopOutOfRange(uint256 unitsPerHop, uint256 maxUnitsPerHop);
    error MinStakeTooLarge(uint256 minStakeWei, uint256 maxStakeWei);
    error ZeroRewardPerEpoch();
    error ZeroHopPrice();
    error MinStakeBelowRegistry(uint256 minStakeWei, uint256 registryMinStakeWei);
    error WindowsExceedUnbonding(uint256 requiredS, uint256 unbondingDelayS);
    error NotNodeWallet(address node, address caller);
    error NodeNotActive(address node);
    error StakeBelowRunMinimum(address node, uint256 stakeWei, uint256 requiredWei);
    error AlreadyMember(uint256 runId, address node);
    error AlreadyLeft(uint256 runId, address node);
    error NotMember(uint256 runId, address node);
    error AlreadyDataNode(uint256 runId, address node);
    error DataNodeNotSponsors(address node, address wallet);
    error PageTooLarge(uint256 limit, uint256 maxLimit);
    error TransferFailed(address to, uint256 amountWei);

    constructor(NodeRegistry registry_) {
        registry = registry_;
    }

    modifier onlySponsor(uint256 runId) {
        address sponsor = _runs[runId].sponsor;
        if (sponsor == address(0)) revert UnknownRun(runId);
        if (sponsor != msg.sender) revert NotSponsor(runId, msg.sender);
        _;
    }

    /// @notice Opens a run that starts now, funded with `msg.value`.
    /// @param config The run's schedule and reward terms.
    /// @return runId The new run's id (from 1).
    function openRun(RunConfig calldata config) external payable returns (uint256 runId) {
        _checkConfig(config);
        if (msg.value > type(uint128).max) revert FundsOverflow(msg.value);
        runId = ++runCount;
        Run storage run = _runs[runId];
        run.sponsor = msg.sender;
        run.startTime = uint40(block.timestamp);
        run.epochLengthS = config.epochLengthS;
        run.stageCount = config.stageCount;
        run.availableWei = uint128(msg.value);
        run.rewardPerEpochWei = config.rewardPerEpochWei;
        run.unitsPerHop = config.unitsPerHop;
        run.minStakeWei = config.minStakeWei;
        run.lastEpoch = OPEN_ENDED;
        run.challengeWindowS = config.challengeWindowS;
        run.hopPriceWei = config.hopPriceWei;
        run.modelConfigHash = config.modelConfigHash;
        run.datasetHash = config.datasetHash;
        emit RunOpened(runId, msg.sender, config, msg.value);
    }

    /// @notice Tops up a run's reward pool with `msg.value`. Sponsor only.
    /// @param runId The run.
    function fundRun(uint256 runId) external payable onlySponsor(runId) {
        Run storage run = _runs[runId];
        if (run.closed) revert RunIsClosed(runId);
        if (msg.value == 0) revert ZeroAmount();
        _creditRun(run, msg.value);
        emit RunFunded(runId, msg.sender, msg.value, run.availableWei);
    }

    /// @notice Names one of the sponsor's nodes a data node of the run: it certifies the hops of
    /// the microbatches it completes. For good: a data node stays one. Sponsor only.
    /// @param runId The run.
    /// @param node The node (registered by the sponsor's wallet, active, with the run's stake).
    function addDataNode(uint256 runId, address node) external onlySponsor(runId) {
        Run storage run = _runs[runId];
        if (run.closed) revert RunIsClosed(runId);
        (address wallet, uint256 stakeWei, NodeRegistry.NodeStatus status) = registry.bondOf(node);
        if (wallet != msg.sender) revert DataNodeNotSponsors(node, wallet);
        if (status != NodeRegistry.NodeStatus.Active) revert NodeNotActive(node);
        if (stakeWei < run.minStakeWei) revert StakeBelowRunMinimum(node, stakeWei, run.minStakeWei);
        if (_membership[runId][node].joinedAt != 0) revert AlreadyMember(runId, node);
        if (_dataNodeSince[runId][node] != 0) revert AlreadyDataNode(runId, node);
        _dataNodeSince[runId][node] = uint40(block.timestamp);
        emit DataNodeAdded(runId, node);
    }

    /// @notice Closes a run: the epoch in progress is its last; unreserved funds become
    /// refundable once that epoch's certificates are all in (its submission period is over).
    /// What certificates reserved stays theirs until their epoch closes.
    /// @param runId The run.
    function closeRun(uint256 runId) external onlySponsor(runId) {
        Run storage run = _runs[runId];
        if (run.closed) revert RunIsClosed(runId);
        uint64 lastEpoch = currentEpoch(runId);
        run.closed = true;
        run.lastEpoch = lastEpoch;
        emit RunClosed(runId, lastEpoch, refundableAt(runId));
    }

    /// @notice Sends the closed run's unreserved funds to the sponsor (what certificates
    /// reserved is paid to workers or burned, never refunded).
    /// @param runId The run.
    function withdrawRefund(uint256 runId) external nonReentrant onlySponsor(runId) {
        Run storage run = _runs[runId];
        if (!run.closed) revert RunNotClosed(runId);
        uint256 unlockAt = refundableAt(runId);
        if (block.timestamp < unlockAt) revert RefundNotYet(runId, unlockAt, block.timestamp);
        uint256 amount = run.availableWei;
        if (amount == 0) revert NothingToWithdraw(msg.sender);
        run.availableWei = 0;
        emit RefundWithdrawn(runId, msg.sender, amount);
        _send(msg.sender, amount);
    }

    /// @notice Adds an active relay with enough stake to the run. Node's wallet only; a node
    /// joins a run once.
    /// @param runId The run.
    /// @param node The node.
    function joinRun(uint256 runId, address node) external {
        Run storage run = _existingRun(runId);
        if (run.closed) revert RunIsClosed(runId);
        (address wallet, uint256 stakeWei, NodeRegistry.NodeStatus status) = registry.bondOf(node);
        if (wallet != msg.sender) revert NotNodeWallet(node, msg.sender);
        if (status != NodeRegistry.NodeStatus.Active) revert NodeNotActive(node);
        if (stakeWei < run.minStakeWei) revert StakeBelowRunMinimum(node, stakeWei, run.minStakeWei);
        if (_dataNodeSince[runId][node] != 0) revert AlreadyDataNode(runId, node);
        Membership storage membership = _membership[runId][node];
        if (membership.leftAt != 0) revert AlreadyLeft(runId, node);
        if (membership.joinedAt != 0) revert AlreadyMember(runId, node);
        _members[runId].push(node);
        membership.joinedAt = uint40(block.timestamp);
        membership.positionPlusOne = uint32(_members[runId].length);
        emit RunJoined(runId, node);
    }

    /// @notice Removes the node from the run for good. Node's wallet only.
    /// @param runId The run.
    /// @param node The node.
    function leaveRun(uint256 runId, address node) external {
        _existingRun(runId);
        (address wallet,,) = registry.bondOf(node);
        if (wallet != msg.sender) revert NotNodeWallet(node, msg.sender);
        Membership storage membership = _membership[runId][node];
        uint256 position = membership.positionPlusOne;
        if (position == 0) revert NotMember(runId, node);
        address[] storage members = _members[runId];
        address moved = members[members.length - 1];
        members[position - 1] = moved; // swap-and-pop keeps the list dense
        _membership[runId][moved].positionPlusOne = uint32(position);
        members.pop();
        membership.positionPlusOne = 0;
        membership.leftAt = uint40(block.timestamp);
        emit RunLeft(runId, node);
    }

    /// @notice A run's terms and state.
    /// @param runId The run.
    /// @return The run (sponsor zero when unknown).
    function getRun(uint256 runId) external view returns (Run memory) {
        return _runs[runId];
    }

    /// @notice The epoch in progress (epochs are numbered from 0 at the run's start).
    /// @param runId The run.
    /// @return The epoch index.
    function currentEpoch(uint256 runId) public view returns (uint64) {
        Run storage run = _existingRun(runId);
        return uint64((block.timestamp - run.startTime) / run.epochLengthS);
    }

    /// @notice The times that frame an epoch's work and its certificates.
    /// @param runId The run.
    /// @param epoch The epoch.
    /// @return startsAt The epoch's work starts here...
    /// @return endsAt ...and ends here, when its certificates are accepted...
    /// @return submitClosesAt ...for one epoch length;
    /// @return settlesAt fraud proofs are judged until here, rewards are paid from here.
    function epochTimes(uint256 runId, uint64 epoch)
        public
        view
        returns (uint256 startsAt, uint256 endsAt, uint256 submitClosesAt, uint256 settlesAt)
    {
        Run storage run = _existingRun(runId);
        startsAt = uint256(run.startTime) + uint256(epoch) * run.epochLengthS;
        endsAt = startsAt + run.epochLengthS;
        submitClosesAt = endsAt + run.epochLengthS;
        settlesAt = submitClosesAt + run.challengeWindowS;
    }

    /// @notice When a closed run's sponsor may withdraw the unreserved funds.
    /// @param runId The run.
    /// @return The time (0 while the run is open).
    function refundableAt(uint256 runId) public view returns (uint256) {
        Run storage run = _existingRun(runId);
        if (!run.closed) return 0;
        (,, uint256 submitClosesAt,) = epochTimes(runId, run.lastEpoch);
        return submitClosesAt;
    }

    /// @notice Whether the node was a member of the run at some time in [from, to).
    /// @param runId The run.
    /// @param node The node.
    /// @param from Start of the interval.
    /// @param to End of the interval.
    /// @return True when it was.
    function wasMemberDuring(uint256 runId, address node, uint256 from, uint256 to) public view returns (bool) {
        Membership storage membership = _membership[runId][node];
        uint256 joinedAt = membership.joinedAt;
        uint256 leftAt = membership.leftAt;
        return joinedAt != 0 && joinedAt < to && (leftAt == 0 || leftAt > from);
    }

    /// @notice Whether the node was a data node of the run at some time before `to`.
    /// @param runId The run.
    /// @param node The node.
    /// @param to End of the interval.
    /// @return True when it was.
    function wasDataNodeBefore(uint256 runId, address node, uint256 to) public view returns (bool) {
        uint256 since = _dataNodeSince[runId][node];
        return since != 0 && since < to;
    }

    /// @notice Whether the peer behind `node` may be served in the run now: a member or a data
    /// node of it, active, with at least the run's minimum stake.
    /// @param runId The run.
    /// @param node The node.
    /// @return True when admitted.
    function isAdmitted(uint256 runId, address node) external view returns (bool) {
        Run storage run = _runs[runId];
        if (run.sponsor == address(0)) return false;
        bool takesPart = _membership[runId][node].positionPlusOne != 0 || _dataNodeSince[runId][node] != 0;
        if (!takesPart) return false;
        (, uint256 stakeWei, NodeRegistry.NodeStatus status) = registry.bondOf(node);
        return status == NodeRegistry.NodeStatus.Active && stakeWei >= run.minStakeWei;
    }

    /// @notice How many nodes are members of the run now (active or not).
    /// @param runId The run.
    /// @return The count.
    function memberCount(uint256 runId) external view returns (uint256) {
        return _members[runId].length;
    }

    /// @notice The members in positions [offset, offset+limit) that are in the active set now.
    /// @param runId The run.
    /// @param offset First position.
    /// @param limit Positions scanned (at most MAX_RUN_PAGE).
    /// @return page The active nodes among them.
    function activeNodesOfRun(uint256 runId, uint256 offset, uint256 limit)
        external
        view
        returns (address[] memory page)
    {
        if (limit > MAX_RUN_PAGE) revert PageTooLarge(limit, MAX_RUN_PAGE);
        address[] storage members = _members[runId];
        uint256 end = offset + limit < members.length ? offset + limit : members.length;
        if (offset >= end) return new address[](0);
        page = new address[](end - offset);
        uint256 found;
        for (uint256 i = offset; i < end; ++i) {
            if (registry.isActive(members[i])) page[found++] = members[i];
        }
        assembly ("memory-safe") {
            mstore(page, found) // shrink to the active entries found
        }
    }

    function _checkConfig(RunConfig calldata config) private view {
        if (config.stageCount == 0 || config.stageCount > MAX_STAGES) {
            revert StageCountOutOfRange(config.stageCount, MAX_STAGES);
        }
        if (config.epochLengthS == 0 || config.epochLengthS > MAX_EPOCH_LENGTH_S) {
            revert EpochLengthOutOfRange(config.epochLengthS, MAX_EPOCH_LENGTH_S);
        }
        if (config.challengeWindowS < MIN_CHALLENGE_WINDOW_S) {
            revert ChallengeWindowTooShort(config.challengeWindowS, MIN_CHALLENGE_WINDOW_S);
        }
        // A backward hop earns twice unitsPerHop, which must still fit a receipt's uint64.
        if (config.unitsPerHop == 0 || config.unitsPerHop > type(uint64).max / 2) {
            revert UnitsPerHopOutOfRange(config.unitsPerHop, type(uint64).max / 2);
        }
        // A node's stake is a uint88: a higher minimum would let nobody take part.
        if (config.minStakeWei > type(uint88).max) revert MinStakeTooLarge(config.minStakeWei, type(uint88).max);
        if (config.rewardPerEpochWei == 0) revert ZeroRewardPerEpoch();
        if (config.hopPriceWei == 0) revert ZeroHopPrice();
        uint256 registryMin = registry.minStakeWei();
        if (config.minStakeWei < registryMin) revert MinStakeBelowRegistry(config.minStakeWei, registryMin);
        // Everything a node can be slashed for in epoch e is judged before settlesAt(e) =
        // start(e) + 2 epoch lengths + the challenge window, and a node bonded during e began
        // unbonding after start(e): with this, its stake unlocks only after settlesAt(e), and
        // proofs (t < settlesAt) and withdrawals (t >= unlock) can never meet.
        uint256 requiredS = 2 * uint256(config.epochLengthS) + config.challengeWindowS;
        uint256 unbondingS = registry.unbondingDelayS();
        if (requiredS > unbondingS) revert WindowsExceedUnbonding(requiredS, unbondingS);
    }

    function _existingRun(uint256 runId) internal view returns (Run storage run) {
        run = _runs[runId];
        if (run.sponsor == address(0)) revert UnknownRun(runId);
    }

    function _creditRun(Run storage run, uint256 amountWei) internal {
        uint256 available = uint256(run.availableWei) + amountWei;
        if (available > type(uint128).max) revert FundsOverflow(available);
        run.availableWei = uint128(available);
    }

    function _send(address to, uint256 amountWei) internal {
        (bool ok,) = to.call{value: amountWei}("");
        if (!ok) revert TransferFailed(to, amountWei);
    }
}
