// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.28;

/// @title ReentrantWallet
/// @notice Test-only attacker: a contract wallet that forwards calls for its owner and, when
/// armed, re-enters a target with prepared calldata from its receive hook (once per payment),
/// recording whether the re-entry succeeded and what it reverted with.
contract ReentrantWallet {
    address public immutable owner;
    address public target;
    bytes public reentryCalldata;
    bool public armed;
    bool public rejecting;
    uint256 public paymentsReceived;
    uint256 public reentryAttempts;
    uint256 public reentrySuccesses;
    bytes public lastReentryRevert;

    error NotOwner(address caller);
    error ForwardFailed(bytes reason);
    error PaymentRejected();

    constructor() {
        owner = msg.sender;
    }

    /// @notice Forwards a call with value from this wallet.
    /// @param to Callee.
    /// @param data Calldata.
    /// @return result The callee's return data.
    function execute(address to, bytes calldata data) external payable returns (bytes memory result) {
        if (msg.sender != owner) revert NotOwner(msg.sender);
        (bool ok, bytes memory returned) = to.call{value: msg.value}(data);
        if (!ok) revert ForwardFailed(returned);
        return returned;
    }

    /// @notice Arms the receive hook to call `to` with `data` on the next payments.
    /// @param to Target to re-enter.
    /// @param data Calldata of the re-entry.
    function arm(address to, bytes calldata data) external {
        if (msg.sender != owner) revert NotOwner(msg.sender);
        target = to;
        reentryCalldata = data;
        armed = true;
    }

    /// @notice Makes the wallet refuse (or accept again) incoming ETH.
    /// @param value True to refuse.
    function setRejecting(bool value) external {
        if (msg.sender != owner) revert NotOwner(msg.sender);
        rejecting = value;
    }

    receive() external payable {
        if (rejecting) revert PaymentRejected();
        paymentsReceived += 1;
        if (!armed) return;
        armed = false; // one attempt per arming keeps the test bounded
        reentryAttempts += 1;
        (bool ok, bytes memory returned) = target.call(reentryCalldata);
        if (ok) reentrySuccesses += 1;
        else lastReentryRevert = returned;
    }
}
