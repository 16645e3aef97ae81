"""The API's response schemas: what a node's local API answers, as pydantic models.

The node fills these in (``gwtf.node.local_api``); the API only serves them. Amounts are
``Amount``s: wei as decimal text (a uint256 outgrows JSON's safe integers) beside the same value in
ETH, exact. Addresses are EIP-55 checksummed, peer ids libp2p's base58.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

WEI_PER_ETH = 10**18


class Schema(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Amount(Schema):
    wei: str = Field(pattern=r"^[0-9]+$", description="the amount in wei, decimal text")
    eth: str = Field(description="the same amount in ETH, exact")

    @classmethod
    def of(cls, wei: int) -> Amount:
        # Integer arithmetic: exact for any uint256 (a Decimal keeps only 28 digits).
        whole, fraction = divmod(wei, WEI_PER_ETH)
        eth = f"{whole}.{fraction:018d}".rstrip("0").rstrip(".")
        return cls(wei=str(wei), eth=eth)


class Health(Schema):
    """``ok``: it trains (hops pass through it). ``idle``: up and reachable, but no training
    goes on through it, and ``detail`` says why (a data node before its first iteration or after
    its last, a relay that computed no hop in the last minute). ``starting``, ``degraded``
    and ``stopping``: it cannot take part now."""

    status: Literal["ok", "idle", "starting", "degraded", "stopping"]
    detail: str = ""


class DiskUse(Schema):
    """The disk the node's data uses, measured every 30 s."""

    database_bytes: int | None = Field(
        description="the SQLite database file and its journal; null for a database server"
    )
    evidence_bytes: int | None = Field(
        description="the hop evidence folder, every run's; null when the node keeps none"
    )
    total_bytes: int
    measured_at: float = Field(description="unix time")


class StageMemory(Schema):
    """What the node's part of the model takes in memory where it trains, computed from its
    modules at start-up (``gwtf.node.training.memory``), and what the machine offered it."""

    weights_bytes: int = Field(description="parameters and buffers")
    gradients_bytes: int
    optimizer_bytes: int = Field(description="AdamW's two moments")
    activations_bytes: int = Field(
        description="saved for backward, for in_flight microbatches of the run's batch_size x "
        "seq_len (and a data node's loss pass)"
    )
    activations_per_microbatch_bytes: int
    in_flight: int = Field(description="microbatches it may hold at once: training.max_in_flight")
    total_bytes: int
    budget_bytes: int = Field(
        description="what it may take: free device memory, available RAM or "
        "training.memory_limit_mib, the lowest"
    )
    budget_source: str


class Status(Schema):
    """What the node is doing now."""

    name: str
    node_address: str
    peer_id: str
    listen: str = Field(description="multiaddr peers reach this node on")
    role: Literal["data", "relay"]
    stage: int = Field(description="0 for a data node, 1..stages for a relay")
    stages: int
    run_id: int
    region: str
    health: Health
    iteration: int = Field(description="the data node's iteration now; a relay's last step")
    epoch: int | None = Field(description="the run's epoch by chain time; null without receipts")
    peers_alive: int
    flows_in: int
    flows_out: int
    hops_computed: int
    hops_recomputed: int
    throughput_hops_per_s: float = Field(description="hops computed per second, last minute")
    loss: float | None = Field(
        description="a data node's last iteration loss; null on a relay, which is not sent it"
    )
    validation_loss: float | None = Field(
        default=None,
        description="a data node's last validation loss of the swarm's model, on its data "
        "set's fixed validation windows (every training.validation_every iterations); null "
        "before the first, without a data set, and on a relay",
    )
    validation_iteration: int | None = Field(
        default=None, description="the iteration after whose step validation_loss was measured"
    )
    validation_verified: bool | None = Field(
        default=None,
        description="true when two relays of every stage served the same weights for "
        "validation_loss; false when a stage's came from one relay, whose word it rests on "
        "(unverified)",
    )
    started_at: float = Field(description="unix time")
    updated_at: float = Field(description="unix time of this snapshot")
    next_claim_at: int | None = Field(
        default=None,
        description="chain time (unix s) from which the next reward can be claimed: when the "
        "oldest epoch with a reward claimable or still to settle settles (by the run's "
        "settings on chain: its end, an epoch for certificates, then the challenge window); "
        "with none, when the epoch running now settles; past: claimable now; null before the "
        "chain is first read",
    )
    next_claim_in_s: int | None = Field(
        default=None, description="seconds from now until next_claim_at; 0: claimable now"
    )
    disk: DiskUse | None = Field(default=None, description="null until first measured")
    reachable: bool | None = Field(
        default=None,
        description="whether peers could dial this node back at its last check: false runs "
        "it outbound-only (it dials its neighbours); null before the first check, and on a "
        "node that listens on loopback only",
    )
    reachability: str = Field(
        default="",
        description="the last check in words and what the node does about it, e.g. "
        "'reachable at /ip4/…' or 'behind NAT: running outbound-only through relay /ip4/…'",
    )
    reachability_checked_at: float | None = Field(
        default=None, description="unix time of the last check; null before the first"
    )
    memory: StageMemory | None = Field(
        default=None, description="its part's memory at the run's batch; null until measured"
    )


class PeerView(Schema):
    peer_id: str
    node_address: str
    role: Literal["data", "relay"]
    stage: int
    region: str
    alive: bool
    capacity: int
    spare: int
    compute_ms: float
    latency_ms: float | None
    place: Literal["upstream", "same stage", "downstream", "other"]


class FlowView(Schema):
    direction: Literal["in", "out"]
    flow_id: str
    peer_id: str | None = Field(description="upstream (in) or next hop (out); null if unmatched")
    state: str
    since_s: float


class EpochEarnings(Schema):
    """One epoch of one run, as this node's database and the chain see it. ``expected`` is the
    contract's share (budget × units ÷ certified units of the epoch), with the certified units
    when known and the node's countersigned units before that. Work no certificate covers is
    missed: it pays nothing, and ``missed`` says why."""

    run_id: int
    epoch: int
    phase: Literal["working", "certifying", "disputable", "settled", "closed", "missed"] = Field(
        description="by chain time; missed: no certificate covers any of this node's work"
    )
    units_worked: int = Field(description="units of this node's countersigned receipts")
    units_certified: int | None = Field(description="units of its ranges in the certificates")
    units_challenged: int = Field(description="units of claims refused: slashed or voided")
    units_missed: int = Field(
        default=0, description="units worked that no certificate covers: they pay nothing"
    )
    missed: str | None = Field(
        default=None,
        description="why work was missed: a data node submitted no certificate before "
        "submissions closed, or its certificate left this node's hops out; null if none was",
    )
    expected: Amount | None = Field(description="null before any certificate of the epoch")
    pending: Amount = Field(description="expected, not yet settled")
    claimable: Amount = Field(description="settled, not yet claimed")
    claimed: Amount = Field(description="claims mined, by this node's records")
    chain_claimed: Amount | None = Field(description="claims mined, by the chain's events")
    chain_budget: Amount | None = Field(description="the epoch's budget on chain")
    chain_total_units: int | None = Field(description="certified units of the epoch, on chain")
    claims: list[ClaimView]


class ClaimView(Schema):
    data_node: str
    units: int
    status: str
    amount: Amount
    tx_hash: str | None
    error: str | None


class StakeHold(Schema):
    """A tensor dispute that keeps this node's stake from being withdrawn: open until the court
    rules (``until`` null), or ruled without a jury and reopenable by its challenger until
    ``until``; after that anyone releases it (``Disputes.releaseAfterGrace``), the node too."""

    dispute_id: int
    run_id: int
    epoch: int
    until: int | None = Field(description="unix time its grace ends; null while it is open")
    releasable: bool = Field(description="its grace is over: a release thaws the stake")
    detail: str = Field(description="the hold in words, for a person")


class Earnings(Schema):
    run_id: int
    node_address: str
    chain_time: int | None = Field(description="unix time of the chain's latest block seen")
    epochs: list[EpochEarnings]
    total_claimed: Amount
    total_claimable: Amount
    total_pending: Amount
    stake_holds: list[StakeHold] = Field(
        default_factory=list, description="the tensor disputes that keep its stake frozen"
    )


class InclusionProof(Schema):
    """Where a hop sits in its data node's certificate on chain: the leaf (OpenZeppelin's
    StandardMerkleTree over ``CertifiedHop``: index, unitsBefore, worker, units, hopKey,
    receiptDigest, signaturesHash) and its proof against ``root``, checked by this node."""

    root: str
    leaf_index: int
    units_before: int
    signatures_hash: str
    siblings: list[str] = Field(description="the Merkle proof, leaf to root")


class ReceiptView(Schema):
    hop_key: str
    run_id: int
    epoch: int
    data_node: str
    iteration: int
    microbatch_id: int
    stage: int
    direction: Literal["forward", "backward"]
    attempt: int
    worker: str
    counterparty: str
    input_digest: str
    output_digest: str
    units: int
    receipt_digest: str = Field(description="the EIP-712 digest both parties signed")
    worker_signature: str
    counterparty_signature: str | None = Field(description="null until countersigned")
    as_worker: bool = Field(description="this node did the hop (else it countersigned it)")
    batch_root: str | None = Field(
        description="the root of the batch both signatures sign; null while it is in no batch"
    )
    batch_proof: list[str] = Field(
        description="the receipt's Merkle proof in its batch, leaf to root (empty: a batch of one)"
    )
    proof: InclusionProof | None = Field(
        description="in the certificate it was paid from; null until this node claimed it"
    )


class ReceiptPage(Schema):
    items: list[ReceiptView]
    total: int
    offset: int
    limit: int


class CapacityView(Schema):
    gpu_model: str
    memory_mib: int
    microbatches_per_hour: int
    max_in_flight: int


class NodeView(Schema):
    """What the chain says of this node (``NodeRegistry``) and of the wallet that staked it."""

    node: str
    wallet: str = Field(description="the operator's wallet: it holds the stake and the rewards")
    peer_id: str
    status: str = Field(description="none, active, unbonding, withdrawn or slashed")
    stake: Amount
    unlock_at: int | None = Field(description="unix time the stake unlocks, while unbonding")
    capacity: CapacityView
    wallet_balance: Amount
    stake_holds: list[StakeHold] = Field(
        default_factory=list, description="the tensor disputes that keep its stake frozen"
    )


class RunView(Schema):
    run_id: int
    sponsor: str
    stage_count: int
    epoch_length_s: int
    challenge_window_s: int
    units_per_hop: int
    reward_per_epoch: Amount = Field(description="the most one epoch's certificates may reserve")
    hop_price: Amount = Field(description="what a certified forward hop earns; a backward, twice")
    pool: Amount
    min_stake: Amount
    open: bool
    member: bool = Field(description="this node is a member of the run")
    data_node: bool = Field(description="this node is one of the run's data nodes")


class Slashed(Schema):
    node: str
    run_id: int
    epoch: int
    fraud: str
    slashed: Amount
    tx_hash: str
    block: int


class ClaimRequest(Schema):
    epoch: int | None = Field(
        default=None, ge=0, le=2**63 - 1, description="one epoch; null claims all"
    )


class ClaimResult(Schema):
    asked: list[int] = Field(description="epochs whose claims were attempted now")
    claims: list[ClaimView]


class Problem(Schema):
    """An error answer: what went wrong and what to do."""

    detail: str


class HistoryPoint(Schema):
    t: float = Field(description="unix time")
    throughput_hops_per_s: float
    loss: float | None = Field(description="a data node's last iteration loss; null on a relay")
    validation_loss: float | None = Field(
        default=None,
        description="a data node's last validation loss by then (see Status.validation_loss); "
        "null on a relay and before the first",
    )


class History(Schema):
    points: list[HistoryPoint]


EpochEarnings.model_rebuild()
