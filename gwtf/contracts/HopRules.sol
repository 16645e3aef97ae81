// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.28;

import {ECDSA} from "@openzeppelin/contracts/utils/cryptography/ECDSA.sol";
import {BatchSeal, BatchSignature, CertifiedHop, CertRef, HopReceipt, HopReceipts} from "./HopReceipts.sol";
import {NodeRegistry} from "./NodeRegistry.sol";
import {WorkLedger} from "./WorkLedger.sol";

/// @title HopRules
/// @notice The rules by which the disputes contract judges one certified hop or two receipts of
/// one hop key: stateless, it only reads facts of the registry and the ledger that never change
/// once written. The `Disputes` constructor deploys it (its `hopRules`), so that the judging of
/// proofs and the disputes contract each fit EIP-170's code size limit with room to spare. Its
/// reverts reach the prover through Disputes unchanged.
contract HopRules {
    using HopReceipts for HopReceipt;

    NodeRegistry public immutable registry;
    WorkLedger public immutable ledger;

    error NotTheLeafsReceipt(uint64 index);
    error HopValid(uint64 index);
    error NotSameHop();
    error SameReceipt();
    error NotOneSigner(address first, address second);
    error SignerNotParty(address signer);

    /// @param registry_ The NodeRegistry.
    /// @param ledger_ The WorkLedger, whose EIP-712 domain the receipts are signed under.
    constructor(NodeRegistry registry_, WorkLedger ledger_) {
        registry = registry_;
        ledger = ledger_;
    }

    /// @notice Reverts unless `receipt` and its seal are the leaf's (its digest and signatures
    /// hash) and the hop breaks a rule an honest data node checks before it certifies a hop
    /// (see `Disputes.proveInvalidHop`). The seal is the one the data node committed, so a
    /// prover cannot make a valid hop look invalid with another proof or signature.
    /// @param cert The certificate the leaf is in (its Merkle proof checked by the caller).
    /// @param hop The leaf.
    /// @param receipt The leaf's receipt.
    /// @param seal Its proof in its batch and the batch's two signatures.
    function checkInvalidHop(
        CertRef calldata cert,
        CertifiedHop calldata hop,
        HopReceipt calldata receipt,
        BatchSeal calldata seal
    ) external view {
        if (hop.receiptDigest != receipt.digest(address(ledger)) || hop.signaturesHash != HopReceipts.signaturesHash(seal))
        {
            revert NotTheLeafsReceipt(hop.index);
        }
        if (_isValidHop(cert, hop, receipt, seal)) revert HopValid(hop.index);
    }

    /// @notice The key that signed batches holding two different receipts of one hop key in
    /// the same role: the worker of both (and the counterparty of neither), or the
    /// counterparty of both (and not the worker). Reverts when the receipts show no such key.
    /// An honest node puts one receipt per hop key in all the batches it ever signs.
    /// @param first One receipt.
    /// @param firstSigned The signer's signature of a batch holding it, with its proof there.
    /// @param second The other receipt, with the same hop key.
    /// @param secondSigned The signer's signature of a batch holding it, with its proof there.
    /// @return signer The equivocating key.
    function equivocator(
        HopReceipt calldata first,
        BatchSignature calldata firstSigned,
        HopReceipt calldata second,
        BatchSignature calldata secondSigned
    ) external view returns (address signer) {
        if (first.hopKey() != second.hopKey()) revert NotSameHop();
        bytes32 firstDigest = first.digest(address(ledger));
        bytes32 secondDigest = second.digest(address(ledger));
        if (firstDigest == secondDigest) revert SameReceipt();
        signer = signerOf(first.batchDigest(firstDigest, firstSigned.proof, address(ledger)), firstSigned.signature);
        address other =
            signerOf(second.batchDigest(secondDigest, secondSigned.proof, address(ledger)), secondSigned.signature);
        if (signer == address(0) || signer != other) revert NotOneSigner(signer, other);
        bool asWorker = signer == first.worker && signer != first.counterparty && signer != second.counterparty;
        bool asCounterparty = signer == first.counterparty && signer == second.counterparty && signer != first.worker;
        if (!asWorker && !asCounterparty) revert SignerNotParty(signer);
    }

    /// @notice The address that signed `digest` (0 for a signature that recovers none).
    function signerOf(bytes32 digest, bytes calldata signature) public pure returns (address) {
        (address signer, ECDSA.RecoverError failure,) = ECDSA.tryRecover(digest, signature);
        return failure == ECDSA.RecoverError.NoError ? signer : address(0);
    }

    /// @dev Every rule an honest data node checks before it certifies a hop. Each reads only
    /// facts that never change once written, so a hop valid when certified stays valid.
    function _isValidHop(
        CertRef calldata cert,
        CertifiedHop calldata hop,
        HopReceipt calldata receipt,
        BatchSeal calldata seal
    ) private view returns (bool) {
        WorkLedger.Run memory run = ledger.getRun(cert.runId);
        bool onSchedule = receipt.runId == cert.runId && receipt.epoch == cert.epoch
            && receipt.dataNode == cert.dataNode && receipt.stage >= 1 && receipt.stage <= run.stageCount
            && receipt.direction <= HopReceipts.BACKWARD
            && receipt.units == HopReceipts.scheduledUnits(receipt.direction, run.unitsPerHop);
        bool leafMatches =
            hop.worker == receipt.worker && hop.units == receipt.units && hop.hopKey == receipt.hopKey();
        if (!onSchedule || !leafMatches || receipt.worker == receipt.counterparty) return false;
        bytes32 batch = receipt.batchDigest(hop.receiptDigest, seal.proof, address(ledger));
        if (signerOf(batch, seal.workerSignature) != receipt.worker) return false;
        if (signerOf(batch, seal.counterpartySignature) != receipt.counterparty) return false;
        (uint256 startsAt, uint256 endsAt,,) = ledger.epochTimes(cert.runId, cert.epoch);
        bool workerTookPart = ledger.wasMemberDuring(cert.runId, receipt.worker, startsAt, endsAt)
            && registry.bondedDuring(receipt.worker, startsAt, endsAt);
        bool counterpartyTookPart = (
            ledger.wasMemberDuring(cert.runId, receipt.counterparty, startsAt, endsAt)
                || ledger.wasDataNodeBefore(cert.runId, receipt.counterparty, endsAt)
        ) && registry.bondedDuring(receipt.counterparty, startsAt, endsAt);
        return workerTookPart && counterpartyTookPart;
    }
}
