"""What each attack class stakes, what the attacker must lock or burn, and its expected value.

Reads the deployed parameters from a suite deployed with the default ``SuiteParams`` on an
in-process eth-tester chain (minimum stake, bounty, tensor bond, court fee, arbitration cost and
jury sizes), takes the pay at stake from the attack tests' figures (two microbatches of a
2-stage run: 0.06 ETH per relay and epoch, ``tests/contracts/test_attacks_on_pay.py``) and gas
from ``bench/gas.py`` at a gas price of ``--gwei``. The expected value is the attacker's gain less
what it loses, against not attacking; the goal is below zero for every class. A jury attack is
valued for an attacker holding a share ``p`` of the eligible juror deposit, which must win the
31-seat final round that the honest side can always appeal to. Wrong tensors in place of honest
work are valued for a relay that corrupts a share f of its hops: the audit re-executes each
worker's first-ranked hop (drawn after the work), so it is caught with P ≥ f and convicted for
the run's minimum stake and its pay of the epoch; its gain is the compute it skips, at most f
of its pay. Printed below the table: the share of a certificate's hops under which wrong
tensors would pay if the audit drew only ``AUDIT_SAMPLE`` hops per certificate.

    .venv/bin/python bench/trust.py [--gwei 1] [--shares 0.2,0.33]
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from math import comb

from eth_tester import EthereumTester
from rich.console import Console
from rich.table import Table
from web3 import EthereumTesterProvider, Web3

from gwtf.contracts.bindings import SuiteParams, deploy_suite

ETH = 10**18
#: Pay at stake per honest relay and epoch in the attack tests (two microbatches).
RELAY_EPOCH_PAY = 6 * 10**16
#: gasUsed from bench/gas.py (gwtf/contracts/README.md's table).
GAS_COMMIT = 52_200
GAS_REVEAL = 174_314  # proveEquivocation, the cheapest reveal
GAS_REGISTER = 194_273
GAS_SUBMIT = 107_029  # submitCertificates, first of an epoch
GAS_REFUSED = 30_000  # the order of a reverted call: what a refused attack still pays
FINAL_SEATS = 31
#: Hops an auditor re-executes per certificate (the swarm's ``[chain] audit_sample``).
AUDIT_SAMPLE = 32
#: Shares of its own hops a cheating relay corrupts.
WRONG_TENSOR_SHARES = (1.0, 0.1, 0.01)


@dataclass(frozen=True)
class Parameters:
    min_stake: int
    bounty_bps: int
    bond: int
    fee: int
    first_fees: int
    sizes: tuple[int, ...]
    reveal_window_blocks: int


def deployed_parameters() -> Parameters:
    w3 = Web3(EthereumTesterProvider(EthereumTester()))
    params = SuiteParams()
    suite = deploy_suite(w3, w3.eth.accounts[0], params)
    disputes, court = suite.disputes.functions, suite.court.functions
    sizes = tuple(int(court.sizeOf(r).call()) for r in range(4))
    return Parameters(
        min_stake=params.min_stake_wei,
        bounty_bps=int(disputes.bountyBps().call()),
        bond=int(disputes.tensorBondWei().call()),
        fee=int(court.feeWei().call()),
        first_fees=int(court.arbitrationCost().call()),
        sizes=sizes,
        reveal_window_blocks=int(disputes.revealWindowBlocks().call()),
    )


def wrong_tensor_break_even(p: Parameters, pay: int = RELAY_EPOCH_PAY) -> float:
    """The share of a certificate's hops below which a relay corrupting all of its hops would
    gain in expectation from a sample of AUDIT_SAMPLE hops per certificate alone: where the
    chance of being sampled times (minimum stake + pay) equals the pay saved."""
    return 1 - (1 - pay / (p.min_stake + pay)) ** (1 / AUDIT_SAMPLE)


def majority_probability(share: float, seats: int = FINAL_SEATS) -> float:
    """P(Bin(seats, share) > seats / 2): a share of the deposit wins a drawn jury."""
    need = seats // 2 + 1
    return sum(
        comb(seats, k) * share**k * (1 - share) ** (seats - k) for k in range(need, seats + 1)
    )


@dataclass(frozen=True)
class Row:
    attack: str
    at_stake: int
    locked_or_burned: str
    expected_wei: float


def rows(p: Parameters, gwei: float, shares: list[float]) -> list[Row]:
    gas = int(gwei * 10**9)
    bounty = p.min_stake * p.bounty_bps // 10_000
    proof_gas = (GAS_COMMIT + GAS_REVEAL) * gas
    penalty = 20 * p.fee
    appeal_fees = sum(size * p.fee for size in p.sizes[1:])
    out = [
        Row(
            "front-run a proof or self-report for the bounty (9, 12)",
            bounty,
            "a commitment per reveal window (~52k gas each)",
            -proof_gas,
        ),
        Row(
            "report oneself from a second wallet (10)",
            p.min_stake,
            "its stake, all but the bounty burned",
            bounty - p.min_stake,
        ),
        Row(
            "block an auditor's dispute with one's own, abandoned (13)",
            bounty,
            "the bond, paid to the worker",
            -p.bond,
        ),
        Row(
            "convict oneself to divert a pending dispute's bounty (14)",
            bounty,
            "its stake (the run's minimum for a wrong tensor)",
            -p.min_stake,
        ),
        Row(
            "flood an honest relay with frivolous disputes (15)",
            p.bond,
            "a bond and the first jury's fees per dispute",
            -(p.bond + p.first_fees),
        ),
        Row(
            "pad a certificate or seat the sponsor's relays to dilute pay (16)",
            RELAY_EPOCH_PAY,
            "the padding's reservation (its own escrow)",
            -GAS_SUBMIT * gas,
        ),
        Row(
            "certify more than the escrow holds (17)",
            RELAY_EPOCH_PAY,
            "gas of the refused submission (BudgetShort)",
            -GAS_REFUSED * gas,
        ),
        Row(
            "convict a data node to void its other epochs (18)",
            2 * RELAY_EPOCH_PAY,
            "the data node's stake and the voided reservation",
            -(p.min_stake + RELAY_EPOCH_PAY),
        ),
        Row(
            "a conviction in one run refuses claims in others (19)",
            RELAY_EPOCH_PAY,
            "the convicted node's stake",
            -p.min_stake,
        ),
        Row(
            "withhold a tree so the budget returns to the sponsor (20)",
            RELAY_EPOCH_PAY,
            "the whole reservation, burned",
            -GAS_SUBMIT * gas,
        ),
        Row(
            "the sponsor rules or sits its own juror (21)",
            p.min_stake,
            "gas of the refused call",
            -GAS_REFUSED * gas,
        ),
        Row(
            "sybil countersigns made-up hops (4)",
            0,
            "the sybil's stake, locked; registration gas",
            -GAS_REGISTER * gas,
        ),
        Row(
            "late overlapping tree takes honest ranges' pay (23)",
            RELAY_EPOCH_PAY,
            "the certificate's reservation (its own escrow)",
            -GAS_REFUSED * gas,
        ),
    ]
    for share in WRONG_TENSOR_SHARES:
        # Against honest work: the compute skipped (at most that share of the pay), less the
        # run's minimum stake and the epoch's pay (refused) when its sampled hop is wrong.
        out.append(
            Row(f"wrong tensors in {share:.0%} of a relay's hops of an epoch (24)",
                p.min_stake + RELAY_EPOCH_PAY,
                f"the run's minimum and the epoch's pay, caught with P >= {share:.2f}",
                share * RELAY_EPOCH_PAY - share * (p.min_stake + RELAY_EPOCH_PAY))
        )  # fmt: skip
    for share in shares:
        win = majority_probability(share)
        seats = sum(p.sizes) * share  # the attacker's expected seats over the four rounds
        expected = win * bounty - (1 - win) * (p.bond + seats * penalty) - p.first_fees
        out.append(
            Row(f"corrupt the jury against an honest relay, {share:.0%} of the deposit (22)",
                p.min_stake,
                f"bond, fees, {seats:.1f} seats' penalties; win P = {win:.1e} (31 seats)",
                expected)
        )  # fmt: skip
    # A corrupt 3-seat ruling is appealed by the honest relay, which funds 7 + 15 + 31 fees
    # that no ruling returns to it, and gets the attacker's bond: the relay's own net.
    out.append(
        Row("honest relay appeals a corrupt first ruling (22): its net", p.bond,
            f"relay pays {appeal_fees / ETH:.3f} ETH of appeal fees, gets the bond",
            float(p.bond - appeal_fees))
    )  # fmt: skip
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gwei", type=float, default=1.0, help="gas price for gas costs")
    parser.add_argument("--shares", default="0.2,0.33", help="juror deposit shares to value")
    args = parser.parse_args()
    shares = [float(s) for s in args.shares.split(",") if s]
    parameters = deployed_parameters()
    table = Table(title=f"Attack classes at the deployed defaults ({args.gwei:g} gwei)")
    for column in ("attack (README row)", "at stake (ETH)", "attacker locks or burns", "EV (ETH)"):
        table.add_column(column, justify="right" if "ETH" in column else "left")
    worst = None
    for row in rows(parameters, args.gwei, shares):
        if "its net" in row.attack:  # the honest side's figure, not an attacker's value
            table.add_row(row.attack, f"{row.at_stake / ETH:.3f}", row.locked_or_burned,
                          f"{row.expected_wei / ETH:+.6f} (honest)")  # fmt: skip
            continue
        table.add_row(row.attack, f"{row.at_stake / ETH:.3f}", row.locked_or_burned,
                      f"{row.expected_wei / ETH:+.6f}")  # fmt: skip
        if worst is None or row.expected_wei > worst.expected_wei:
            worst = row
    Console(width=160).print(table)
    assert worst is not None
    verdict = "met" if worst.expected_wei < 0 else f"not met ({worst.attack})"
    print(f"goal: every class's expected value < 0: {verdict}")
    print(
        f"without each worker's hop in the sample, {AUDIT_SAMPLE} hops per certificate would let "
        f"wrong tensors pay below {wrong_tensor_break_even(parameters):.2%} of its hops"
    )


if __name__ == "__main__":
    main()
