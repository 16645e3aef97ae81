// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.28;

import {Ownable} from "@openzeppelin/contracts/access/Ownable.sol";
import {Ownable2Step} from "@openzeppelin/contracts/access/Ownable2Step.sol";
import {ReentrancyGuard} from "@openzeppelin/contracts/utils/ReentrancyGuard.sol";
import {EIP712} from "@openzeppelin/contracts/utils/cryptography/EIP712.sol";
import {ECDSA} from "@openzeppelin/contracts/utils/cryptography/ECDSA.sol";

/// @title NodeRegistry
/// @notice Volunteers' nodes, their capacity and their stake. A wallet registers a node (an
/// ECDSA "node address" whose key the node process holds, bound to a libp2p peer id) with a stake;
/// one wallet may run several nodes. Unstaking leaves the active set at once and unlocks the stake
/// after an unbonding delay. Only the work ledger may slash.
contract NodeRegistry is Ownable2Step, ReentrancyGuard, EIP712 {
    enum NodeStatus {
        None,
        Active,
        Unbonding,
        Withdrawn,
        Slashed
    }

    /// @notice What a node offers; `microbatchesPerHour` is the node's measured throughput.
    struct Capacity {
        string gpuModel;
        uint32 memoryMiB;
        uint32 microbatchesPerHour;
        uint16 maxInFlight;
    }

    /// @dev Slot 0 holds everything the ledger reads when a root is submitted (one cold SLOAD).
    struct Node {
        address wallet;
        uint88 stakeWei;
        NodeStatus status;
        uint40 unlockAt;
        uint40 registeredAt;
        bytes peerId;
        Capacity capacity;
    }

    bytes32 public constant NODE_BINDING_TYPEHASH =
        keccak256("NodeBinding(address wallet,bytes peerId,address node)");
    uint256 public constant MAX_PEER_ID_BYTES = 128;
    uint256 public constant MAX_GPU_MODEL_BYTES = 64;
    uint256 public constant MAX_PAGE = 100;

    uint256 public immutable minStakeWei;
    uint256 public immutable unbondingDelayS;

    /// @notice The only contract allowed to slash; set once by the owner after deployment.
    address public ledger;
    /// @notice Sum of the stakes of all nodes (equals the ETH this contract holds).
    uint256 public totalStakedWei;

    mapping(address node => Node) private _nodes;
    mapping(address wallet => address[]) private _walletNodes;
    mapping(bytes32 peerIdHash => address node) public nodeOfPeerId;

    event LedgerSet(address indexed ledger);
    event NodeRegistered(
        address indexed node, address indexed wallet, bytes peerId, uint256 stakeWei, Capacity capacity
    );
    event StakeAdded(address indexed node, uint256 amountWei, uint256 stakeWei);
    event CapacityUpdated(address indexed node, Capacity capacity);
    event UnstakeRequested(address indexed node, uint256 unlockAt);
    event StakeWithdrawn(address indexed node, address indexed wallet, uint256 amountWei);
    event NodeSlashed(address indexed node, uint256 amountWei);

    error LedgerAlreadySet(address ledger);
    error NotLedger(address caller);
    error ZeroAddress();
    error NodeAlreadyRegistered(address node);
    error UnknownNode(address node);
    error NotNodeWallet(address node, address caller);
    error NodeNotActive(address node, NodeStatus status);
    error NodeNotUnbonding(address node, NodeStatus status);
    error StakeStillLocked(address node, uint256 unlockAt, uint256 nowS);
    error InsufficientStake(address node, uint256 stakeWei, uint256 requiredWei);
    error ZeroAmount();
    error StakeOverflow(uint256 stakeWei);
    error PeerIdLengthInvalid(uint256 length, uint256 maxLength);
    error PeerIdTaken(bytes32 peerIdHash, address node);
    error InvalidCapacity();
    error BadBindingSignature(address node, address signer);
    error TransferFailed(address to, uint256 amountWei);
    error PageTooLarge(uint256 limit, uint256 maxLimit);

    modifier onlyNodeWallet(address node) {
        address wallet = _nodes[node].wallet;
        if (wallet == address(0)) revert UnknownNode(node);
        if (wallet != msg.sender) revert NotNodeWallet(node, msg.sender);
        _;
    }

    /// @param minStakeWei_ Smallest stake a node may register with.
    /// @param unbondingDelayS_ Seconds between an unstake request and the withdrawal it unlocks.
    /// @param owner_ Account that wires the ledger once after deployment.
    constructor(uint256 minStakeWei_, uint256 unbondingDelayS_, address owner_)
        Ownable(owner_)
        EIP712("GWTF Registry", "1")
    {
        if (minStakeWei_ == 0) revert ZeroAmount();
        minStakeWei = minStakeWei_;
        unbondingDelayS = unbondingDelayS_;
    }

    /// @notice Names the work ledger, the only contract that may slash. Callable once, by the owner.
    /// @param ledger_ The WorkLedger address.
    function setLedger(address ledger_) external onlyOwner {
        if (ledger != address(0)) revert LedgerAlreadySet(ledger);
        if (ledger_ == address(0)) revert ZeroAddress();
        ledger = ledger_;
        emit LedgerSet(ledger_);
    }

    /// @notice Registers `node` for the calling wallet with `msg.value` as stake.
    /// @param node The node's ECDSA address (its key signs receipts and the binding).
    /// @param peerId The node's libp2p peer id bytes.
    /// @param capacity What the node offers.
    /// @param bindingSignature The node key's EIP-712 signature of NodeBinding(wallet, peerId, node).
    function registerNode(
        address node,
        bytes calldata peerId,
        Capacity calldata capacity,
        bytes calldata bindingSignature
    ) external payable {
        if (node == address(0)) revert ZeroAddress();
        if (_nodes[node].status != NodeStatus.None) revert NodeAlreadyRegistered(node);
        if (peerId.length == 0 || peerId.length > MAX_PEER_ID_BYTES) {
            revert PeerIdLengthInvalid(peerId.length, MAX_PEER_ID_BYTES);
        }
        bytes32 peerIdHash = keccak256(peerId);
        if (nodeOfPeerId[peerIdHash] != address(0)) {
            revert PeerIdTaken(peerIdHash, nodeOfPeerId[peerIdHash]);
        }
        _checkCapacity(capacity);
        if (msg.value < minStakeWei) revert InsufficientStake(node, msg.value, minStakeWei);
        if (msg.value > type(uint88).max) revert StakeOverflow(msg.value);
        address signer = ECDSA.recover(bindingDigest(msg.sender, peerId, node), bindingSignature);
        if (signer != node) revert BadBindingSignature(node, signer);

        Node storage record = _nodes[node];
        record.wallet = msg.sender;
        record.stakeWei = uint88(msg.value);
        record.status = NodeStatus.Active;
        record.registeredAt = uint40(block.timestamp);
        record.peerId = peerId;
        record.capacity = capacity;
        nodeOfPeerId[peerIdHash] = node;
        _walletNodes[msg.sender].push(node);
        totalStakedWei += msg.value;
        emit NodeRegistered(node, msg.sender, peerId, msg.value, capacity);
    }

    /// @notice Adds `msg.value` to an active node's stake.
    /// @param node The node to top up.
    function addStake(address node) external payable onlyNodeWallet(node) {
        Node storage record = _nodes[node];
        if (record.status != NodeStatus.Active) revert NodeNotActive(node, record.status);
        if (msg.value == 0) revert ZeroAmount();
        uint256 newStake = uint256(record.stakeWei) + msg.value;
        if (newStake > type(uint88).max) revert StakeOverflow(newStake);
        record.stakeWei = uint88(newStake);
        totalStakedWei += msg.value;
        emit StakeAdded(node, msg.value, newStake);
    }

    /// @notice Replaces an active node's advertised capacity.
    /// @param node The node.
    /// @param capacity The new capacity.
    function updateCapacity(address node, Capacity calldata capacity) external onlyNodeWallet(node) {
        Node storage record = _nodes[node];
        if (record.status != NodeStatus.Active) revert NodeNotActive(node, record.status);
        _checkCapacity(capacity);
        record.capacity = capacity;
        emit CapacityUpdated(node, capacity);
    }

    /// @notice Takes the node out of the active set now; its stake unlocks after the delay.
    /// @param node The node.
    function requestUnstake(address node) external onlyNodeWallet(node) {
        Node storage record = _nodes[node];
        if (record.status != NodeStatus.Active) revert NodeNotActive(node, record.status);
        uint256 unlockAt = block.timestamp + unbondingDelayS;
        record.status = NodeStatus.Unbonding;
        record.unlockAt = uint40(unlockAt);
        emit UnstakeRequested(node, unlockAt);
    }

    /// @notice Sends an unbonded node's stake to its wallet once the unbonding delay has passed.
    /// @param node The node.
    function withdrawStake(address node) external nonReentrant onlyNodeWallet(node) {
        Node storage record = _nodes[node];
        if (record.status != NodeStatus.Unbonding) revert NodeNotUnbonding(node, record.status);
        if (block.timestamp < record.unlockAt) {
            revert StakeStillLocked(node, record.unlockAt, block.timestamp);
        }
        uint256 amount = record.stakeWei;
        record.stakeWei = 0;
        record.status = NodeStatus.Withdrawn;
        totalStakedWei -= amount;
        emit StakeWithdrawn(node, msg.sender, amount);
        _send(msg.sender, amount);
    }

    /// @notice Confiscates the node's whole stake and sends it to the ledger, which shares it
    /// between the challenger and the run's pool. Only the ledger may call; a node with nothing
    /// left at stake yields 0.
    /// @param node The convicted node.
    /// @return amountWei The stake taken.
    function slash(address node) external nonReentrant returns (uint256 amountWei) {
        if (msg.sender != ledger) revert NotLedger(msg.sender);
        Node storage record = _nodes[node];
        if (record.status == NodeStatus.None) revert UnknownNode(node);
        amountWei = record.stakeWei;
        record.stakeWei = 0;
        if (record.status != NodeStatus.Withdrawn) record.status = NodeStatus.Slashed;
        totalStakedWei -= amountWei;
        emit NodeSlashed(node, amountWei);
        _send(msg.sender, amountWei);
    }

    /// @notice The EIP-712 digest the node key signs to bind itself to `wallet` and `peerId`.
    /// @param wallet The wallet that registers the node.
    /// @param peerId The libp2p peer id bytes.
    /// @param node The node address.
    /// @return The digest (binds chain id and this registry's address through the domain).
    function bindingDigest(address wallet, bytes calldata peerId, address node)
        public
        view
        returns (bytes32)
    {
        return _hashTypedDataV4(
            keccak256(abi.encode(NODE_BINDING_TYPEHASH, wallet, keccak256(peerId), node))
        );
    }

    /// @notice Everything known about a node.
    /// @param node The node address.
    /// @return The record (status None when unknown).
    function getNode(address node) external view returns (Node memory) {
        return _nodes[node];
    }

    /// @notice The fields the ledger needs to accept a claim or a join, in one call.
    /// @param node The node address.
    /// @return wallet Its wallet (zero when unknown).
    /// @return stakeWei Its stake at risk.
    /// @return status Its status.
    /// @return unlockAt When an unbonding stake unlocks (0 when not unbonding).
    function bondOf(address node)
        external
        view
        returns (address wallet, uint256 stakeWei, NodeStatus status, uint256 unlockAt)
    {
        Node storage record = _nodes[node];
        status = record.status;
        // unlockAt lives in the second slot: read it only when it means something.
        unlockAt = status == NodeStatus.Unbonding ? record.unlockAt : 0;
        return (record.wallet, record.stakeWei, status, unlockAt);
    }

    /// @notice Whether the node is in the active set (registered, staked, not unbonding).
    /// @param node The node address.
    /// @return True when active.
    function isActive(address node) public view returns (bool) {
        return _nodes[node].status == NodeStatus.Active;
    }

    /// @notice How many nodes `wallet` has registered.
    /// @param wallet The wallet.
    /// @return The count.
    function nodeCountOf(address wallet) external view returns (uint256) {
        return _walletNodes[wallet].length;
    }

    /// @notice A page of the nodes `wallet` has registered, in registration order.
    /// @param wallet The wallet.
    /// @param offset First index.
    /// @param limit Most entries returned (at most MAX_PAGE).
    /// @return page The node addresses.
    function nodesOf(address wallet, uint256 offset, uint256 limit)
        external
        view
        returns (address[] memory page)
    {
        if (limit > MAX_PAGE) revert PageTooLarge(limit, MAX_PAGE);
        address[] storage all = _walletNodes[wallet];
        uint256 end = offset + limit < all.length ? offset + limit : all.length;
        if (offset >= end) return new address[](0);
        page = new address[](end - offset);
        for (uint256 i = offset; i < end; ++i) {
            page[i - offset] = all[i];
        }
    }

    function _checkCapacity(Capacity calldata capacity) private pure {
        uint256 modelLength = bytes(capacity.gpuModel).length;
        if (
            modelLength == 0 || modelLength > MAX_GPU_MODEL_BYTES || capacity.memoryMiB == 0
                || capacity.microbatchesPerHour == 0 || capacity.maxInFlight == 0
        ) revert InvalidCapacity();
    }

    function _send(address to, uint256 amountWei) private {
        if (amountWei == 0) return;
        (bool ok,) = to.call{value: amountWei}("");
        if (!ok) revert TransferFailed(to, amountWei);
    }
}
