// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.28;

import {Ownable} from "@openzeppelin/contracts/access/Ownable.sol";
import {Ownable2Step} from "@openzeppelin/contracts/access/Ownable2Step.sol";
import {ReentrancyGuard} from "@openzeppelin/contracts/utils/ReentrancyGuard.sol";
import {EIP712} from "@openzeppelin/contracts/utils/cryptography/EIP712.sol";
import {ECDSA} from "@openzeppelin/contracts/utils/cryptography/ECDSA.sol";

/// @title NodeRegistry
/// @notice Volunteers' nodes, their capacity and their stake. A node is one secp256k1 key: its
/// Ethereum address is the node's address here, the same key is its libp2p identity (so its peer
/// id follows from its public key) and it signs hop receipts. A wallet registers a node with a
/// stake and the node key's signature binding the two; one wallet may run several nodes.
/// Unstaking leaves the active set at once and unlocks the stake after an unbonding delay. Only
/// the disputes contract may slash.
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

    /// @dev Slot 0 holds what a claim or a join reads; slot 1 the times `bondedDuring` reads.
    /// The times are written once each, so facts about the past never change.
    struct Node {
        address wallet;
        uint88 stakeWei;
        NodeStatus status;
        uint40 registeredAt;
        uint40 unbondingAt; // 0 until an unstake is requested
        uint40 slashedAt; // 0 until slashed
        Capacity capacity;
    }

    bytes32 public constant NODE_BINDING_TYPEHASH = keccak256("NodeBinding(address wallet,address node)");
    /// @dev A libp2p peer id of a secp256k1 key: identity multihash (0x00, 37 bytes) of the
    /// protobuf PublicKey {Type: Secp256k1 (0x08 0x02), Data: 33 bytes (0x12 0x21)}.
    bytes6 internal constant PEER_ID_PREFIX = 0x002508021221;
    uint256 public constant PUBLIC_KEY_BYTES = 64;
    uint256 public constant MAX_GPU_MODEL_BYTES = 64;
    uint256 public constant MAX_PAGE = 100;

    uint256 public immutable minStakeWei;
    uint256 public immutable unbondingDelayS;

    /// @notice The only contract allowed to slash; set once by the owner after deployment.
    address public slasher;
    /// @notice Sum of the stakes of all nodes (equals the ETH this contract holds).
    uint256 public totalStakedWei;

    mapping(address node => Node) private _nodes;
    mapping(address wallet => address[]) private _walletNodes;
    /// @notice Open tensor disputes about each node: its stake is not withdrawn until they end.
    mapping(address node => uint256) public frozenCount;

    event SlasherSet(address indexed slasher);
    event NodeRegistered(
        address indexed node, address indexed wallet, bytes peerId, uint256 stakeWei, Capacity capacity
    );
    event StakeAdded(address indexed node, uint256 amountWei, uint256 stakeWei);
    event CapacityUpdated(address indexed node, Capacity capacity);
    event UnstakeRequested(address indexed node, uint256 unlockAt);
    event StakeWithdrawn(address indexed node, address indexed wallet, uint256 amountWei);
    event NodeSlashed(address indexed node, uint256 amountWei);

    error SlasherAlreadySet(address slasher);
    error NotSlasher(address caller);
    error ZeroAddress();
    error ZeroUnbondingDelay();
    error NodeAlreadyRegistered(address node);
    error UnknownNode(address node);
    error NotNodeWallet(address node, address caller);
    error NodeNotActive(address node, NodeStatus status);
    error NodeNotUnbonding(address node, NodeStatus status);
    error StakeStillLocked(address node, uint256 unlockAt, uint256 nowS);
    error InsufficientStake(address node, uint256 stakeWei, uint256 requiredWei);
    error ZeroAmount();
    error StakeOverflow(uint256 stakeWei);
    error PublicKeyInvalid(uint256 length);
    error InvalidCapacity();
    error BadBindingSignature(address node, address signer);
    error TransferFailed(address to, uint256 amountWei);
    error PageTooLarge(uint256 limit, uint256 maxLimit);
    error StakeFrozen(address node, uint256 openDisputes);

    modifier onlyNodeWallet(address node) {
        address wallet = _nodes[node].wallet;
        if (wallet == address(0)) revert UnknownNode(node);
        if (wallet != msg.sender) revert NotNodeWallet(node, msg.sender);
        _;
    }

    /// @param minStakeWei_ Smallest stake a node may register with.
    /// @param unbondingDelayS_ Seconds between an unstake request and the withdrawal it unlocks;
    /// every run's windows must fit in it (WorkLedger.openRun checks).
    /// @param owner_ Account that names the slasher once after deployment.
    constructor(uint256 minStakeWei_, uint256 unbondingDelayS_, address owner_)
        Ownable(owner_)
        EIP712("GWTF Registry", "1")
    {
        if (minStakeWei_ == 0) revert ZeroAmount();
        if (unbondingDelayS_ == 0) revert ZeroUnbondingDelay();
        minStakeWei = minStakeWei_;
        unbondingDelayS = unbondingDelayS_;
    }

    /// @notice Names the disputes contract, the only one that may slash. Once, by the owner.
    /// @param slasher_ The Disputes address.
    function setSlasher(address slasher_) external onlyOwner {
        if (slasher != address(0)) revert SlasherAlreadySet(slasher);
        if (slasher_ == address(0)) revert ZeroAddress();
        slasher = slasher_;
        emit SlasherSet(slasher_);
    }

    /// @notice Registers the node whose public key is `publicKey` for the calling wallet, with
    /// `msg.value` as stake. The node's address and libp2p peer id both follow from the key, so
    /// nobody can bind another's peer id: the key itself must sign the binding.
    /// @param publicKey The node's uncompressed secp256k1 public key, x ‖ y (64 bytes).
    /// @param capacity What the node offers.
    /// @param bindingSignature The node key's EIP-712 signature of NodeBinding(wallet, node).
    function registerNode(bytes calldata publicKey, Capacity calldata capacity, bytes calldata bindingSignature)
        external
        payable
    {
        address node = nodeAddressOf(publicKey);
        if (_nodes[node].status != NodeStatus.None) revert NodeAlreadyRegistered(node);
        _checkCapacity(capacity);
        if (msg.value < minStakeWei) revert InsufficientStake(node, msg.value, minStakeWei);
        if (msg.value > type(uint88).max) revert StakeOverflow(msg.value);
        // The signer's address is keccak256 of its public key, so a match also proves that
        // `publicKey` is the signer's: no other key hashes to that address.
        address signer = ECDSA.recover(bindingDigest(msg.sender, node), bindingSignature);
        if (signer != node) revert BadBindingSignature(node, signer);

        Node storage record = _nodes[node];
        record.wallet = msg.sender;
        record.stakeWei = uint88(msg.value);
        record.status = NodeStatus.Active;
        record.registeredAt = uint40(block.timestamp);
        record.capacity = capacity;
        _walletNodes[msg.sender].push(node);
        totalStakedWei += msg.value;
        emit NodeRegistered(node, msg.sender, peerIdOf(publicKey), msg.value, capacity);
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
        record.status = NodeStatus.Unbonding;
        record.unbondingAt = uint40(block.timestamp);
        emit UnstakeRequested(node, block.timestamp + unbondingDelayS);
    }

    /// @notice Sends an unbonded node's stake to its wallet once the unbonding delay has passed.
    /// @param node The node.
    function withdrawStake(address node) external nonReentrant onlyNodeWallet(node) {
        Node storage record = _nodes[node];
        if (record.status != NodeStatus.Unbonding) revert NodeNotUnbonding(node, record.status);
        uint256 unlocksAt = uint256(record.unbondingAt) + unbondingDelayS;
        if (block.timestamp < unlocksAt) revert StakeStillLocked(node, unlocksAt, block.timestamp);
        if (frozenCount[node] != 0) revert StakeFrozen(node, frozenCount[node]);
        uint256 amount = record.stakeWei;
        record.stakeWei = 0;
        record.status = NodeStatus.Withdrawn;
        totalStakedWei -= amount;
        emit StakeWithdrawn(node, msg.sender, amount);
        _send(msg.sender, amount);
    }

    /// @notice Confiscates at most `maxWei` of the node's stake and sends it to the slasher,
    /// which pays the challenger's bounty and burns the rest. A node left with nothing at stake
    /// is Slashed (no longer bonded from now on); one left with some keeps its status and the
    /// rest of its stake. Only the slasher may call; a node with nothing at stake yields 0.
    /// @param node The convicted node.
    /// @param maxWei The most to take.
    /// @return amountWei The stake taken.
    function slashUpTo(address node, uint256 maxWei) external nonReentrant returns (uint256 amountWei) {
        return _slash(node, maxWei);
    }

    /// @notice Confiscates the node's whole stake (slashUpTo with no bound).
    /// @param node The convicted node.
    /// @return amountWei The stake taken.
    function slash(address node) external nonReentrant returns (uint256 amountWei) {
        return _slash(node, type(uint256).max);
    }

    function _slash(address node, uint256 maxWei) private returns (uint256 amountWei) {
        if (msg.sender != slasher) revert NotSlasher(msg.sender);
        Node storage record = _nodes[node];
        if (record.status == NodeStatus.None) revert UnknownNode(node);
        uint256 staked = record.stakeWei;
        amountWei = staked < maxWei ? staked : maxWei;
        record.stakeWei = uint88(staked - amountWei);
        if (staked == amountWei) {
            if (record.slashedAt == 0) record.slashedAt = uint40(block.timestamp);
            if (record.status != NodeStatus.Withdrawn) record.status = NodeStatus.Slashed;
        }
        totalStakedWei -= amountWei;
        emit NodeSlashed(node, amountWei);
        _send(msg.sender, amountWei);
    }

    /// @notice Keeps the node's stake from being withdrawn until a matching thawStake: a tensor
    /// dispute about it awaits the court, whose ruling may come after the unbonding delay.
    /// Only the slasher may call.
    /// @param node The accused node.
    function freezeStake(address node) external {
        if (msg.sender != slasher) revert NotSlasher(msg.sender);
        frozenCount[node] += 1;
    }

    /// @notice Ends one freezeStake. Only the slasher may call.
    /// @param node The node.
    function thawStake(address node) external {
        if (msg.sender != slasher) revert NotSlasher(msg.sender);
        frozenCount[node] -= 1;
    }

    /// @notice The EIP-712 digest the node key signs to bind itself to `wallet`.
    /// @param wallet The wallet that registers the node.
    /// @param node The node address.
    /// @return The digest (binds chain id and this registry's address through the domain).
    function bindingDigest(address wallet, address node) public view returns (bytes32) {
        return _hashTypedDataV4(keccak256(abi.encode(NODE_BINDING_TYPEHASH, wallet, node)));
    }

    /// @notice The node address of a public key: the last 20 bytes of its keccak256.
    /// @param publicKey The uncompressed secp256k1 public key, x ‖ y.
    /// @return The address.
    function nodeAddressOf(bytes calldata publicKey) public pure returns (address) {
        if (publicKey.length != PUBLIC_KEY_BYTES) revert PublicKeyInvalid(publicKey.length);
        return address(uint160(uint256(keccak256(publicKey))));
    }

    /// @notice The libp2p peer id of a public key: the identity multihash of its compressed form.
    /// @param publicKey The uncompressed secp256k1 public key, x ‖ y.
    /// @return The peer id bytes (39).
    function peerIdOf(bytes calldata publicKey) public pure returns (bytes memory) {
        if (publicKey.length != PUBLIC_KEY_BYTES) revert PublicKeyInvalid(publicKey.length);
        bytes1 parity = uint8(publicKey[63]) % 2 == 0 ? bytes1(0x02) : bytes1(0x03);
        return bytes.concat(PEER_ID_PREFIX, parity, publicKey[:32]);
    }

    /// @notice Everything known about a node.
    /// @param node The node address.
    /// @return The record (status None when unknown).
    function getNode(address node) external view returns (Node memory) {
        return _nodes[node];
    }

    /// @notice The fields a join, a submission or a claim needs, in one call.
    /// @param node The node address.
    /// @return wallet Its wallet (zero when unknown).
    /// @return stakeWei Its stake at risk.
    /// @return status Its status.
    function bondOf(address node) external view returns (address wallet, uint256 stakeWei, NodeStatus status) {
        Node storage record = _nodes[node];
        return (record.wallet, record.stakeWei, record.status);
    }

    /// @notice Whether the node had its stake at risk at some time in [from, to): registered
    /// before `to`, and neither unbonding nor slashed before `from`. It reads only times written
    /// once, so the answer for a past interval never changes.
    /// @param node The node address.
    /// @param from Start of the interval.
    /// @param to End of the interval.
    /// @return True when bonded in it.
    function bondedDuring(address node, uint256 from, uint256 to) external view returns (bool) {
        Node storage record = _nodes[node];
        uint256 registeredAt = record.registeredAt;
        uint256 unbondingAt = record.unbondingAt;
        uint256 slashedAt = record.slashedAt;
        return registeredAt != 0 && registeredAt < to && (unbondingAt == 0 || unbondingAt > from)
            && (slashedAt == 0 || slashedAt > from);
    }

    /// @notice When an unbonding node's stake unlocks (0 when it is not unbonding).
    /// @param node The node address.
    /// @return The time.
    function unlockAt(address node) external view returns (uint256) {
        Node storage record = _nodes[node];
        return record.status == NodeStatus.Unbonding ? uint256(record.unbondingAt) + unbondingDelayS : 0;
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
    function nodesOf(address wallet, uint256 offset, uint256 limit) external view returns (address[] memory page) {
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
