"""The transactions a volunteer, a sponsor or an auditor sends, each one short function.

Every action takes the deployed contracts (``Contracts``) and a ``Sender`` (a local key from a
keystore, or an account unlocked on a devnet) and goes through ``Contracts.send``, which checks
funds and decodes a revert into the contract's custom error. Each returns the mined receipt, so
the caller reads gas used and events from the chain rather than assuming them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from web3 import Web3
from web3.logs import DISCARD

from gwtf.contracts.bindings import attach
from gwtf.contracts.certificate_tree import CertificateTree
from gwtf.contracts.encoding import (
    CertRef,
    WorkerSpan,
    node_public_key,
    registry_domain,
    sign_binding,
    sign_digest,
)
from gwtf.contracts.fraud_proofs import (
    NEEDS_JURY,
    FraudProof,
    commitment_of,
    disputed_receipt_digest,
    draw_salt_hash,
)
from gwtf.contracts.keccak import keccak256
from gwtf.errors import ChainError, ConfigError
from gwtf.node.chain.adapter import Sender, Web3Chain, connect, send_transaction, transact_as
from gwtf.node.chain.deployment import DevnetInfo, read_devnet_file
from gwtf.node.settings import Settings

if TYPE_CHECKING:
    from gwtf.node.training.settings import TrainingSettings

REGISTRY = "NodeRegistry"
LEDGER = "WorkLedger"
DISPUTES = "Disputes"
COURT = "Court"
SUITE = (REGISTRY, LEDGER, DISPUTES, COURT)


@dataclass(frozen=True)
class Contracts:
    """The deployed suite a command works with."""

    w3: Web3
    registry: Any
    ledger: Any
    disputes: Any
    court: Any
    #: Fixed gas limit for every transaction (after a revert check), or None to estimate.
    gas_limit: int | None = None

    @classmethod
    def at(cls, w3: Web3, addresses: dict[str, str], gas_limit: int | None = None) -> Contracts:
        missing = [name for name in SUITE if name not in addresses]
        if missing:
            raise ChainError(
                f"no address for {', '.join(missing)}; redeploy with `gwtf-node devnet`"
            )
        contracts = {name: attach(w3, name, addresses[name]) for name in SUITE}
        for name, contract in contracts.items():
            if not w3.eth.get_code(contract.address):
                raise ChainError(
                    f"no {name} contract at {contract.address} on this chain; "
                    "restart `gwtf-node devnet` (a devnet forgets everything when it stops)"
                )
        suite = cls(
            w3, contracts[REGISTRY], contracts[LEDGER], contracts[DISPUTES], contracts[COURT],
            gas_limit,
        )  # fmt: skip
        suite.check_wiring()
        return suite

    def check_wiring(self) -> None:
        """Refuse contracts that are not wired to each other as ``deploy_suite`` wires them: a
        registry whose slasher is someone else's could slash anyone."""
        registry, ledger, disputes, court = self.registry, self.ledger, self.disputes, self.court
        links = {
            "Court.arbitrable": (court.functions.arbitrable(), disputes.address),
            "Court.registry": (court.functions.registry(), registry.address),
            "Disputes.court": (disputes.functions.court(), court.address),
            "NodeRegistry.slasher": (registry.functions.slasher(), disputes.address),
            "WorkLedger.disputes": (ledger.functions.disputes(), disputes.address),
            "WorkLedger.registry": (ledger.functions.registry(), registry.address),
            "Disputes.registry": (disputes.functions.registry(), registry.address),
            "Disputes.ledger": (disputes.functions.ledger(), ledger.address),
        }
        wrong = [name for name, (view, expected) in links.items() if view.call() != expected]
        if wrong:
            raise ChainError(
                f"the contracts are not wired to each other ({', '.join(wrong)}); "
                "deploy them with `gwtf-node devnet` or gwtf.contracts.bindings.deploy_suite"
            )

    @classmethod
    def from_devnet(cls, w3: Web3, info: DevnetInfo) -> Contracts:
        return cls.at(w3, info.contracts)

    def port(self) -> Web3Chain:
        return Web3Chain(self.registry, self.ledger)

    def send(self, sender: Sender, fn: Any, value_wei: int = 0) -> Any:
        return transact_as(self.w3, sender, fn, value_wei, gas_limit=self.gas_limit)


@dataclass(frozen=True)
class Capacity:
    gpu_model: str
    memory_mib: int
    microbatches_per_hour: int
    max_in_flight: int

    def as_tuple(self) -> tuple[str, int, int, int]:
        return (self.gpu_model, self.memory_mib, self.microbatches_per_hour, self.max_in_flight)


@dataclass(frozen=True)
class RunConfig:
    model_config_hash: bytes
    dataset_hash: bytes
    stage_count: int
    epoch_length_s: int
    units_per_hop: int
    reward_per_epoch_wei: int
    challenge_window_s: int
    min_stake_wei: int
    #: What a certified hop of ``units_per_hop`` units earns (a backward, twice the units, twice).
    hop_price_wei: int

    def as_tuple(self) -> tuple[object, ...]:
        # Field order of RunBook.RunConfig.
        return (
            self.model_config_hash,
            self.dataset_hash,
            self.stage_count,
            self.epoch_length_s,
            self.units_per_hop,
            self.reward_per_epoch_wei,
            self.challenge_window_s,
            self.min_stake_wei,
            self.hop_price_wei,
        )


#: What a run's dataset hash names: the corpus shipped with the node (``gwtf.node.training.data``).
DATASET_HASH = Web3.keccak(text="node.training.data default corpus")


@dataclass(frozen=True)
class RunModel:
    """What every node of a run must build and feed alike, committed on chain as the run's
    model config hash: the model (as ``training.model`` names it) in its stages, its vocabulary
    (the tokenizer's), and the sequence length, batch size and seed, which decide the initial
    weights and which tokens each microbatch id reads (``gwtf.node.training.window_map``). The data
    set itself is the run's other commitment, its data set hash."""

    model: str
    stages: int
    vocab_size: int
    seq_len: int
    batch_size: int
    seed: int
    #: What activations and gradients travel as (``training.wire_dtype``): a half-precision wire
    #: changes every hop's bytes, so it is part of what the run trains.
    wire_dtype: str = "param"

    @classmethod
    def of(cls, training: TrainingSettings, stages: int | None = None) -> RunModel:
        """The run model ``training`` names (its vocabulary: ``training.data``'s tokenizer's,
        else ``training.vocab_size``, else the byte tokenizer's)."""
        from gwtf.node.training.shards import run_vocab

        return cls(
            training.model,
            training.stages if stages is None else stages,
            run_vocab(training.data, training.vocab_size),
            training.seq_len,
            training.batch_size,
            training.seed,
            training.wire_dtype,
        )

    def describe(self) -> str:
        wire = "" if self.wire_dtype == "param" else f", wire {self.wire_dtype}"
        return (
            f"{self.model}, {self.stages} stages, vocabulary {self.vocab_size}, "
            f"seq_len {self.seq_len}, batch_size {self.batch_size}, seed {self.seed}{wire}"
        )

    @property
    def config_hash(self) -> bytes:
        return bytes(Web3.keccak(text=self.describe()))


def model_config_hash(run: RunModel) -> bytes:
    """A run's model commitment (``RunModel``)."""
    return run.config_hash


def dataset_hash_of(data: str) -> bytes:
    """The data set hash of ``data`` (``training.data``: a prepared data set's manifest or
    folder, the SHA-256 of its manifest), or ``DATASET_HASH`` for the shipped corpus."""
    if not data:
        return bytes(DATASET_HASH)
    from gwtf.node.training.shards import load_manifest

    return bytes.fromhex(load_manifest(data).digest)


def check_run_dataset(run_id: int, run_dataset_hash: bytes, data: str) -> None:
    """Refuse a data set other than the one run ``run_id`` committed to on chain."""
    local = dataset_hash_of(data)
    if local == run_dataset_hash:
        return
    if run_dataset_hash == bytes(DATASET_HASH):
        raise ConfigError(
            f"run {run_id} trains on the shipped corpus, not on training.data={data!r} "
            f"(0x{local.hex()}); clear training.data"
        )
    named = f"training.data={data!r} (0x{local.hex()})" if data else "the shipped corpus"
    raise ConfigError(
        f"run {run_id} trains on data set 0x{run_dataset_hash.hex()}, not on {named}; set "
        "training.data to the run's prepared data set"
    )


def register_node(
    c: Contracts, wallet: Sender, node_key: bytes, capacity: Capacity, stake_wei: int
) -> Any:
    """Register the node whose key is ``node_key`` under ``wallet``, with a stake: the key signs
    the binding, and the registry derives the node's address and peer id from its public key."""
    domain = registry_domain(c.w3.eth.chain_id, c.registry.address)
    signature = sign_binding(wallet.address, node_key, domain)
    fn = c.registry.functions.registerNode(
        node_public_key(node_key), capacity.as_tuple(), signature
    )
    return c.send(wallet, fn, stake_wei)


def add_stake(c: Contracts, wallet: Sender, node: str, amount_wei: int) -> Any:
    return c.send(wallet, c.registry.functions.addStake(node), amount_wei)


def request_unstake(c: Contracts, wallet: Sender, node: str) -> Any:
    return c.send(wallet, c.registry.functions.requestUnstake(node))


def withdraw_stake(c: Contracts, wallet: Sender, node: str) -> Any:
    return c.send(wallet, c.registry.functions.withdrawStake(node))


def open_run(c: Contracts, sponsor: Sender, config: RunConfig, funding_wei: int) -> int:
    """Open a run funded with ``funding_wei``; returns its id, read from the RunOpened event."""
    receipt = c.send(sponsor, c.ledger.functions.openRun(config.as_tuple()), funding_wei)
    (event,) = c.ledger.events.RunOpened().process_receipt(receipt, errors=DISCARD)
    return int(event["args"]["runId"])


def fund_run(c: Contracts, sponsor: Sender, run_id: int, amount_wei: int) -> Any:
    return c.send(sponsor, c.ledger.functions.fundRun(run_id), amount_wei)


def close_run(c: Contracts, sponsor: Sender, run_id: int) -> Any:
    """Close a run: no epoch after the current one is paid; refundable after its claims."""
    return c.send(sponsor, c.ledger.functions.closeRun(run_id))


def withdraw_refund(c: Contracts, sponsor: Sender, run_id: int) -> int:
    """Withdraw a closed run's unspent funds; returns the wei refunded (its event's)."""
    receipt = c.send(sponsor, c.ledger.functions.withdrawRefund(run_id))
    (event,) = c.ledger.events.RefundWithdrawn().process_receipt(receipt, errors=DISCARD)
    return int(event["args"]["amountWei"])


def add_data_node(c: Contracts, sponsor: Sender, run_id: int, node: str) -> Any:
    """Name one of the sponsor's nodes a data node of the run (it certifies hops)."""
    return c.send(sponsor, c.ledger.functions.addDataNode(run_id, node))


def join_run(c: Contracts, wallet: Sender, run_id: int, node: str) -> Any:
    return c.send(wallet, c.ledger.functions.joinRun(run_id, node))


def submit_certificates(
    c: Contracts, sponsor: Sender, cert: CertRef, spans: Sequence[WorkerSpan]
) -> Any:
    """Commit a data node's certificate tree and its workers' spans for an epoch (from the data
    node's wallet)."""
    fn = c.ledger.functions.submitCertificates(
        cert.runId, cert.epoch, cert.dataNode, cert.root, cert.count, cert.units,
        [span.as_tuple() for span in spans],
    )  # fmt: skip
    return c.send(sponsor, fn)


def claim_reward(
    c: Contracts, wallet: Sender, cert: CertRef, tree: CertificateTree, node: str
) -> Any:
    """Claim ``node``'s range of a data node's certificate tree, once the epoch settled."""
    span = tree.worker_range(node)
    if span is None:
        raise ChainError(f"node {node} has no hops in data node {cert.dataNode}'s certificate")
    return c.send(wallet, c.ledger.functions.claimReward(*span.claim_args(cert)))


def close_epoch(c: Contracts, sender: Sender, run_id: int, epoch: int) -> Any:
    """Once an epoch's claim period is over, return what nobody claimed to the run's pool."""
    return c.send(sender, c.ledger.functions.closeEpoch(run_id, epoch))


def commit_proof(c: Contracts, challenger: Sender, proof: FraudProof, salt: bytes) -> Any:
    """The first half of a fraud proof: commit to it; reveal it from the next block on."""
    commitment = commitment_of(challenger.address, salt, proof.proof_hash)
    return c.send(challenger, c.disputes.functions.commit(commitment))


def reveal_proof(
    c: Contracts, challenger: Sender, proof: FraudProof, salt: bytes, gas_limit: int | None = None
) -> Any:
    """The second half: the proof itself, which slashes the accused if it holds (a tensor
    dispute commits the challenger's draw salt, ``draw_salt_of``). With ``gas_limit`` it is
    checked against the pending block and sent with that limit."""
    args: tuple[Any, ...] = (*proof.args, salt)
    if proof.fraud in NEEDS_JURY:
        digest = disputed_receipt_digest(proof)
        # A dispute of ours on the receipt already: this reveal can only reopen it (the
        # contract refuses it otherwise), and the reopening's jury gets a salt of its own.
        prior = int(c.disputes.functions.tensorDisputeOf(digest, challenger.address).call())
        args += (draw_salt_hash(draw_salt_of(challenger, digest, reopens=prior)),)
    fn = getattr(c.disputes.functions, proof.function)(*args)
    bond_wei = bond_of(c, proof)
    if gas_limit is None:
        return c.send(challenger, fn, bond_wei)
    return transact_as(c.w3, challenger, fn, bond_wei, gas_limit=gas_limit)


def bond_of(c: Contracts, proof: FraudProof) -> int:
    """What revealing ``proof`` costs beyond gas: a tensor dispute's bond and the court's first
    jury fees, else nothing."""
    if proof.fraud not in NEEDS_JURY:
        return 0
    bond = int(c.disputes.functions.tensorBondWei().call())
    return bond + int(c.court.functions.arbitrationCost().call())


def secret_of(sender: Sender, purpose: bytes) -> bytes:
    """A secret only ``sender``'s key can make, the same each time: a deterministic (RFC 6979)
    signature of a message no contract asks to be signed. An account the chain unlocks (a dev
    chain's) has no key here: its "secret" is derived from its address, which anyone can."""
    message = keccak256(b"gwtf secret " + purpose)
    if sender.account is None:
        return keccak256(bytes.fromhex(sender.address[2:]) + message)
    return keccak256(sign_digest(message, bytes(sender.account.key)))


def draw_salt_of(challenger: Sender, receipt_digest: bytes, reopens: int = 0) -> bytes:
    """The challenger's share of the jury randomness of its dispute about a receipt: committed
    when it opens the dispute, revealed to the court once the accused has answered. A
    reopening (of dispute ``reopens``) takes another salt: the first case revealed its own on
    chain, and an accused that knew the challenger's salt before answering could pick its
    answer, and so its jury, where the beacon adds nothing (a constant ``prevrandao``)."""
    suffix = b"" if reopens == 0 else f" reopening {reopens}".encode()
    return secret_of(challenger, b"draw salt " + receipt_digest + suffix)


def vote_salt_of(juror: Sender, case_id: int, round_: int, node: str) -> bytes:
    """A juror's vote salt for one case and round: committed sealed, revealed later."""
    return secret_of(juror, f"vote salt {case_id} {round_} {node.lower()}".encode())


def deposit_juror(c: Contracts, wallet: Sender, node: str, amount_wei: int) -> Any:
    """Lock ``amount_wei`` more as ``node``'s juror deposit (one juror node per wallet)."""
    return c.send(wallet, c.court.functions.deposit(node), amount_wei)


def withdraw_juror_deposit(c: Contracts, wallet: Sender, node: str, amount_wei: int) -> Any:
    return c.send(wallet, c.court.functions.withdrawDeposit(node, amount_wei))


def award_bounty(c: Contracts, sender: Sender, node: str) -> Any:
    """Credit a convicted node's bounty to the earliest proven commitment, once it is final."""
    return c.send(sender, c.disputes.functions.awardBounty(node))


def release_after_grace(c: Contracts, sender: Sender, dispute_id: int) -> Any:
    """Thaw the stake a dispute ruled without a jury held, once its grace is over (anyone)."""
    return c.send(sender, c.disputes.functions.releaseAfterGrace(dispute_id))


def withdraw_credit(c: Contracts, account: Sender) -> Any:
    """Withdraw the bounties credited to ``account``."""
    return c.send(account, c.disputes.functions.withdrawCredit())


def transfer_eth(w3: Web3, sender: Sender, to: str, amount_wei: int) -> Any:
    """Plain ETH transfer (``gwtf-node fund`` on a devnet)."""
    tx = {"to": Web3.to_checksum_address(to), "value": amount_wei, "gas": 21_000}
    return send_transaction(w3, sender, tx)


def open_contracts(settings: Settings) -> tuple[Contracts, DevnetInfo]:
    """Connect to the configured chain and the contracts named in the devnet file."""
    info = read_devnet_file(settings.chain.devnet_file)
    w3 = connect(
        settings.chain.rpc_url or info.rpc_url,
        timeout_s=settings.chain.rpc_timeout_s,
        rpc_token=settings.chain.rpc_token,
    )
    return Contracts.from_devnet(w3, info), info
