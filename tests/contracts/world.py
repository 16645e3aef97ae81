"""Test vocabulary for the contracts: accounts with roles, node keys, runs, receipts,
certificate trees, claims and fraud proofs."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from eth_account import Account
from eth_tester import EthereumTester
from eth_utils.crypto import keccak
from web3 import Web3
from web3.types import TxReceipt

from gwtf.contracts import fraud_proofs
from gwtf.contracts.bindings import ContractRevert, Suite, SuiteParams, call, transact
from gwtf.contracts.certificate_tree import (
    CertificateTree,
    SignedReceipt,
    build_certificate_tree,
    ranges_tree,
    spans_of,
    tree_of_hops,
)
from gwtf.contracts.encoding import (
    CertifiedHop,
    CertRef,
    Eip712Domain,
    HopReceipt,
    WorkerSpan,
    ledger_domain,
    node_address_of,
    node_public_key,
    peer_id_of_public_key,
    registry_domain,
    scheduled_units,
    sign_binding,
    sign_receipt,
)
from gwtf.contracts.fraud_proofs import FraudProof

ETH = 10**18
TEST_GAS_LIMIT = 3_000_000
EPOCH_S = 1_000
WINDOW_S = 2_000
UNITS_PER_HOP = 100
REWARD_PER_EPOCH = 3 * ETH
#: What a certified forward hop (UNITS_PER_HOP units) earns; a backward earns twice.
HOP_PRICE = 10**16
STAGES = 2


@dataclass(frozen=True)
class NodeKey:
    """A node's secp256k1 key: its address on chain, its libp2p identity, its receipt signer."""

    private_key: bytes
    address: str
    public_key: bytes
    peer_id: bytes

    @classmethod
    def derive(cls, label: str) -> NodeKey:
        private_key = keccak(text=f"gwtf test node {label}")
        public_key = node_public_key(private_key)
        address = Account.from_key(private_key).address
        assert address == node_address_of(public_key)
        return cls(private_key, address, public_key, peer_id_of_public_key(public_key))


def default_capacity() -> tuple[str, int, int, int]:
    return ("RTX 4090", 24_576, 3_600, 4)


def spans_covering(hops: Sequence[CertifiedHop], count: int, units: int) -> list[WorkerSpan]:
    """Spans the ledger takes for ``hops`` submitted as ``count`` leaves and ``units``: the
    tree's own (``spans_of`` of the first ``count`` leaves) with the last stretched or shrunk to
    the certificate's end, or, when those do not partition it, one span of the first leaf's
    worker over everything (what a dishonest data node can always submit)."""
    spans = list(spans_of(hops[:count]) or ())
    if spans:
        spans[-1] = replace(spans[-1], lastIndex=count - 1, unitsEnd=units)
        before = spans[-2] if len(spans) > 1 else None
        if before is None or (before.lastIndex < count - 1 and before.unitsEnd < units):
            return spans
    return [WorkerSpan(hops[0].worker, max(count - 1, 0), units)]


@dataclass
class World:
    tester: EthereumTester
    w3: Web3
    suite: Suite
    params: SuiteParams
    keys: dict[str, NodeKey] = field(default_factory=dict)
    scenarios: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    #: Each tensor dispute's draw salt, by (challenger, proof hash): revealed to the court.
    draw_salts: dict[tuple[str, bytes], bytes] = field(default_factory=dict)
    #: The spans of every tree and certificate built here, by their range tree's root:
    #: ``submit`` sends the spans a certificate's ranges root was made from.
    spans: dict[bytes, tuple[WorkerSpan, ...]] = field(default_factory=dict)

    def scenario(self, name: str, build: Callable[[], Any]) -> Any:
        """Runs ``build`` once per session and snapshots the chain after it; later tests jump
        straight to that snapshot (py-evm snapshots can be reverted to repeatedly)."""
        if name in self.scenarios:
            snapshot, value = self.scenarios[name]
            self.tester.revert_to_snapshot(snapshot)
            return value
        value = build()
        self.scenarios[name] = (self.tester.take_snapshot(), value)
        return value

    # ------------------------------------------------------------ accounts and time
    @property
    def deployer(self) -> str:
        return str(self.w3.eth.accounts[0])

    @property
    def sponsor(self) -> str:
        return str(self.w3.eth.accounts[1])

    def wallet(self, i: int) -> str:
        return str(self.w3.eth.accounts[2 + i])  # wallets 0..3 -> accounts 2..5

    @property
    def challenger(self) -> str:
        return str(self.w3.eth.accounts[6])

    @property
    def stranger(self) -> str:
        return str(self.w3.eth.accounts[7])

    @property
    def attacker(self) -> str:
        return str(self.w3.eth.accounts[8])

    @property
    def accomplice(self) -> str:
        return str(self.w3.eth.accounts[9])

    def key(self, label: str) -> NodeKey:
        if label not in self.keys:
            self.keys[label] = NodeKey.derive(label)
        return self.keys[label]

    def now(self) -> int:
        return int(self.w3.eth.get_block("latest")["timestamp"])

    def travel_to(self, timestamp: int) -> None:
        """Moves the clock so that the next transaction's block has ``timestamp`` (eth_call on
        "latest" sees one second less), or the pending block's time where the wall clock has
        taken it past ``timestamp`` already (a chain's clock never goes back)."""
        pending = int(self.tester.get_block_by_number("pending")["timestamp"])
        if timestamp > pending:
            self.tester.time_travel(timestamp)

    def mine(self) -> None:
        self.tester.mine_blocks(1)

    @property
    def registry(self) -> Any:
        return self.suite.registry

    @property
    def ledger(self) -> Any:
        return self.suite.ledger

    @property
    def disputes(self) -> Any:
        return self.suite.disputes

    @property
    def court(self) -> Any:
        return self.suite.court

    @property
    def ledger_domain(self) -> Eip712Domain:
        return ledger_domain(self.w3.eth.chain_id, self.ledger.address)

    @property
    def registry_domain(self) -> Eip712Domain:
        return registry_domain(self.w3.eth.chain_id, self.registry.address)

    def tx(self, fn: Any, sender: str, value: int = 0) -> TxReceipt:
        # A fixed gas limit skips py-evm's binary-search estimation (~13 executions per
        # transaction); a revert is then mined and replayed by `transact` for its reason.
        return transact(self.w3, fn, sender, value, gas=TEST_GAS_LIMIT)

    def call(self, fn: Any, sender: str | None = None) -> Any:
        return call(fn, sender)

    def balance(self, account: str) -> int:
        return int(self.w3.eth.get_balance(account))

    # ------------------------------------------------------------ registry
    def register(self, label: str, wallet: str, stake_wei: int = 2 * ETH) -> NodeKey:
        key = self.key(label)
        signature = sign_binding(wallet, key.private_key, self.registry_domain)
        fn = self.registry.functions.registerNode(key.public_key, default_capacity(), signature)
        self.tx(fn, wallet, stake_wei)
        return key

    def stake_of(self, key: NodeKey) -> int:
        return int(self.registry.functions.bondOf(key.address).call()[1])

    def status_of(self, key: NodeKey) -> int:
        return int(self.registry.functions.bondOf(key.address).call()[2])

    # ------------------------------------------------------------ runs
    def run_config(self, **overrides: Any) -> tuple[Any, ...]:
        config = {
            "modelConfigHash": keccak(text="model"),
            "datasetHash": keccak(text="data"),
            "stageCount": STAGES,
            "epochLengthS": EPOCH_S,
            "unitsPerHop": UNITS_PER_HOP,
            "rewardPerEpochWei": REWARD_PER_EPOCH,
            "challengeWindowS": WINDOW_S,
            "minStakeWei": ETH,
            "hopPriceWei": HOP_PRICE,
        }
        config.update(overrides)
        return tuple(config.values())

    def open_run(self, funding_wei: int = 10 * ETH, **overrides: Any) -> int:
        receipt = self.tx(
            self.ledger.functions.openRun(self.run_config(**overrides)), self.sponsor, funding_wei
        )
        (event,) = self.ledger.events.RunOpened().process_receipt(receipt)
        return int(event["args"]["runId"])

    def add_data_node(self, run_id: int, key: NodeKey) -> None:
        self.tx(self.ledger.functions.addDataNode(run_id, key.address), self.sponsor)

    def join(self, run_id: int, key: NodeKey, wallet: str) -> None:
        self.tx(self.ledger.functions.joinRun(run_id, key.address), wallet)

    def epoch_times(self, run_id: int, epoch: int) -> tuple[int, int, int, int]:
        """(startsAt, endsAt, submitClosesAt, settlesAt)."""
        return tuple(self.ledger.functions.epochTimes(run_id, epoch).call())  # type: ignore[return-value]

    def to_submission(self, run_id: int, epoch: int) -> None:
        _, ends_at, _, _ = self.epoch_times(run_id, epoch)
        if self.now() < ends_at:
            self.travel_to(ends_at + 1)  # calls on "latest" are inside the period too

    def to_settled(self, run_id: int, epoch: int) -> None:
        _, _, _, settles_at = self.epoch_times(run_id, epoch)
        self.travel_to(max(settles_at + 1, self.now() + 1))

    # ------------------------------------------------------------ receipts and certificates
    def receipt(
        self,
        run_id: int,
        epoch: int,
        data_node: NodeKey,
        worker: NodeKey,
        counterparty: NodeKey,
        microbatch: int,
        stage: int = 1,
        direction: int = 0,
        attempt: int = 0,
        **overrides: Any,
    ) -> HopReceipt:
        fields: dict[str, Any] = {
            "runId": run_id,
            "epoch": epoch,
            "dataNode": data_node.address,
            "iteration": microbatch // 4,
            "microbatchId": microbatch,
            "stage": stage,
            "direction": direction,
            "attempt": attempt,
            "worker": worker.address,
            "counterparty": counterparty.address,
            "inputDigest": keccak(text=f"in {microbatch} {stage} {direction} {attempt}"),
            "outputDigest": keccak(text=f"out {microbatch} {stage} {direction} {attempt}"),
            "units": scheduled_units(direction, UNITS_PER_HOP),
        }
        fields.update(overrides)
        return HopReceipt(**fields)

    def signed(
        self,
        receipt: HopReceipt,
        worker: NodeKey,
        counterparty: NodeKey,
        domain: Eip712Domain | None = None,
    ) -> SignedReceipt:
        """The receipt signed by ``worker`` and countersigned by ``counterparty``."""
        domain = domain or self.ledger_domain
        return SignedReceipt(
            receipt,
            sign_receipt(receipt, domain, worker.private_key),
            sign_receipt(receipt, domain, counterparty.private_key),
        )

    def pipeline_hops(
        self,
        run_id: int,
        epoch: int,
        data_node: NodeKey,
        relays: Sequence[NodeKey],
        microbatches: Sequence[int],
    ) -> list[SignedReceipt]:
        """Every hop of ``microbatches`` through ``relays`` (one per stage, 1..S): each forward
        countersigned by the next stage (the data node after the last), each backward by the
        stage before (the data node before the first)."""
        hops: list[SignedReceipt] = []
        stages = len(relays)
        for m in microbatches:
            for stage, relay in enumerate(relays, start=1):
                after = relays[stage] if stage < stages else data_node
                before = relays[stage - 2] if stage > 1 else data_node
                forward = self.receipt(run_id, epoch, data_node, relay, after, m, stage, 0)
                backward = self.receipt(run_id, epoch, data_node, relay, before, m, stage, 1)
                hops += [self.signed(forward, relay, after), self.signed(backward, relay, before)]
        return hops

    def certificate_tree(self, entries: Sequence[SignedReceipt]) -> CertificateTree:
        tree = build_certificate_tree(entries, self.ledger_domain)
        self._remember_spans(tree.spans_or_raise())
        return tree

    def dishonest_tree(
        self, hops: Sequence[CertifiedHop], spans: Sequence[WorkerSpan] | None = None
    ) -> CertificateTree:
        """The tree of ``hops`` as given, with ``spans`` (else its own when its leaves are one
        range per worker, else the one span ``spans_covering`` gives)."""
        tree = tree_of_hops(hops, spans)
        if tree.spans is None:
            tree = tree_of_hops(hops, spans_covering(hops, len(hops), tree.units))
        self._remember_spans(tree.spans_or_raise())
        return tree

    def cert_of(
        self, tree: CertificateTree, run_id: int, epoch: int, data_node: str, *,
        count: int | None = None, units: int | None = None,
        spans: Sequence[WorkerSpan] | None = None,
    ) -> CertRef:  # fmt: skip
        """The certificate a data node submits for ``tree`` as ``count`` leaves and ``units``
        (the tree's own unless given), with ``spans``, else the tree's when they end there, else
        ``spans_covering`` its leaves."""
        count = tree.count if count is None else count
        units = tree.units if units is None else units
        own = tree.spans
        if spans is None and own and (own[-1].lastIndex, own[-1].unitsEnd) == (count - 1, units):
            spans = own
        if spans is None:
            spans = spans_covering(tree.hops, count, units)
        ranges_root = self._remember_spans(tuple(spans))
        return CertRef(run_id, epoch, data_node, tree.root, count, units, ranges_root)

    def _remember_spans(self, spans: Sequence[WorkerSpan]) -> bytes:
        root = ranges_tree(spans).root
        self.spans[root] = tuple(spans)
        return root

    def submit_fn(self, cert: CertRef, spans: Sequence[WorkerSpan] | None = None) -> Any:
        """``submitCertificates`` of ``cert`` with ``spans`` or else the spans its ranges root
        was made from here."""
        if spans is None:
            assert cert.rangesRoot in self.spans, "no spans here make this ranges root"
            spans = self.spans[cert.rangesRoot]
        return self.ledger.functions.submitCertificates(
            cert.runId, cert.epoch, cert.dataNode, cert.root, cert.count, cert.units,
            [span.as_tuple() for span in spans],
        )  # fmt: skip

    def submit(
        self, cert: CertRef, wallet: str | None = None, *,
        spans: Sequence[WorkerSpan] | None = None,
    ) -> TxReceipt:  # fmt: skip
        return self.tx(self.submit_fn(cert, spans), wallet or self.sponsor)

    def certify(
        self, tree: CertificateTree, run_id: int, epoch: int, data_node: NodeKey
    ) -> CertRef:
        """Submits ``tree`` as the data node's certificate (moving to the submission period)."""
        self.to_submission(run_id, epoch)
        cert = self.cert_of(tree, run_id, epoch, data_node.address)
        self.submit(cert)
        return cert

    def claim_fn(self, cert: CertRef, tree: CertificateTree, worker: NodeKey) -> Any:
        span = tree.worker_range(worker.address)
        assert span is not None, f"{worker.address} has no hops in the tree"
        return self.ledger.functions.claimReward(*span.claim_args(cert))

    def claim(
        self, cert: CertRef, tree: CertificateTree, worker: NodeKey, wallet: str
    ) -> TxReceipt:
        return self.tx(self.claim_fn(cert, tree, worker), wallet)

    # ------------------------------------------------------------ disputes
    def equivocation(self, signer: NodeKey, first: HopReceipt, second: HopReceipt) -> FraudProof:
        """The proof that ``signer`` signed both receipts (of one hop)."""
        domain = self.ledger_domain
        return fraud_proofs.equivocation(
            signer.address,
            first,
            sign_receipt(first, domain, signer.private_key),
            second,
            sign_receipt(second, domain, signer.private_key),
        )

    def commit(self, proof: FraudProof, challenger: str, salt: bytes | None = None) -> bytes:
        """Commits to ``proof`` for ``challenger`` and mines a block; returns the salt."""
        salt = salt or os.urandom(32)
        commitment = fraud_proofs.commitment_of(challenger, salt, proof.proof_hash)
        self.tx(self.disputes.functions.commit(commitment), challenger)
        self.mine()
        return salt

    def reveal_fn(self, proof: FraudProof, salt: bytes, challenger: str | None = None) -> Any:
        """The proof's reveal; a tensor dispute's carries the hash of a fresh draw salt that
        ``draw_salts`` keeps for ``challenger`` (the world's challenger by default)."""
        fn = getattr(self.disputes.functions, proof.function)
        if proof.fraud not in fraud_proofs.NEEDS_JURY:
            return fn(*proof.args, salt)
        draw_salt = os.urandom(32)
        self.draw_salts[(challenger or self.challenger, proof.proof_hash)] = draw_salt
        return fn(*proof.args, salt, fraud_proofs.draw_salt_hash(draw_salt))

    def bond_of(self, proof: FraudProof) -> int:
        """What revealing ``proof`` costs: a tensor dispute's bond and first jury's fees,
        nothing for the others."""
        if proof.fraud not in fraud_proofs.NEEDS_JURY:
            return 0
        bond = int(self.call(self.disputes.functions.tensorBondWei()))
        return bond + int(self.call(self.court.functions.arbitrationCost()))

    def award(self, node: str) -> TxReceipt:
        """Mines until no commitment earlier than the one leading for ``node``'s bounty can be
        revealed, then awards the bounty."""
        final_after = int(self.call(self.disputes.functions.convictions(node))[3])
        if self.w3.eth.block_number < final_after:
            self.tester.mine_blocks(final_after - self.w3.eth.block_number)
        return self.tx(self.disputes.functions.awardBounty(node), self.stranger)

    def prove(self, proof: FraudProof, challenger: str | None = None) -> TxReceipt:
        """Commits, then reveals ``proof`` a block later."""
        challenger = challenger or self.challenger
        salt = self.commit(proof, challenger)
        return self.tx(self.reveal_fn(proof, salt, challenger), challenger, self.bond_of(proof))


def expect_revert(excinfo: Any, name: str, *args: Any) -> None:
    """Asserts a ContractRevert by error name and arguments."""
    error = excinfo.value
    assert isinstance(error, ContractRevert), error
    assert error.name == name, f"expected {name}{args}, got {error.name}{error.args}"
    if args:
        assert error.args == args, f"{name}: expected args {args}, got {error.args}"


def reverts(w: World, fn: Any, sender: str, name: str, *args: Any, value: int = 0) -> None:
    """Sends ``fn`` and asserts it reverts with custom error ``name`` and exactly ``args``."""
    try:
        w.tx(fn, sender, value)
    except ContractRevert as error:
        assert error.name == name, f"expected {name}{args}, got {error.name}{error.args}"
        assert error.args == args, f"{name}: expected args {args}, got {error.args}"
        return
    raise AssertionError(f"expected revert {name}{args}, but the transaction succeeded")


def proof_reverts(w: World, proof: FraudProof, name: str, *args: Any) -> None:
    """Commits ``proof`` for the challenger and asserts its reveal reverts with ``name``."""
    salt = w.commit(proof, w.challenger)
    reverts(w, w.reveal_fn(proof, salt), w.challenger, name, *args, value=w.bond_of(proof))
