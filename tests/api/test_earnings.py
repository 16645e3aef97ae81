"""A node's earnings per epoch, put together from its records and the chain's: the phase of each
epoch by chain time, the contract's share of the budget, what is pending, claimable, claimed
and lost to a challenge."""

from __future__ import annotations

from dataclasses import replace

from gwtf.contracts.rewards import reward_wei
from gwtf.node.chain.epochs import EpochBook, EpochTimes, RewardPaid
from gwtf.node.local_api.earnings import (
    ChainView,
    ClaimRecord,
    earnings_of,
    next_claim_at,
    phase_of,
)
from gwtf.node.local_api.snapshot import ChainParts, next_claim

TIMES = EpochTimes(100, 200, 250, 800)
BOOK = EpochBook(10**18, 7, True, 0, 0, False)
DN = "0x" + "cd" * 20


def view(now: int, book: EpochBook = BOOK, paid: tuple[RewardPaid, ...] = ()) -> ChainView:
    return ChainView(now, {0: TIMES}, {0: book}, paid)


def test_phases_follow_chain_time() -> None:
    phases = [phase_of(TIMES, BOOK, t) for t in (150, 200, 249, 250, 799, 800)]
    assert phases == ["working", "certifying", "certifying", "disputable", "disputable", "settled"]
    closed = EpochBook(10**18, 7, True, 7, 10**18, True)
    assert phase_of(TIMES, closed, 900) == "closed"


def test_the_expected_share_is_the_contracts_formula_rounded_down() -> None:
    (epoch,) = earnings_of(1, {0: {DN: 3}}, [], view(300))
    assert epoch.expected is not None and int(epoch.expected.wei) == reward_wei(10**18, 3, 7)
    assert int(epoch.expected.wei) == 10**18 * 3 // 7  # 428571428571428571: rounded down
    assert epoch.pending == epoch.expected and epoch.claimable.wei == "0"


def test_a_settled_epoch_is_claimable_until_claimed() -> None:
    (settled,) = earnings_of(1, {0: {DN: 3}}, [], view(800))
    assert settled.claimable == settled.expected and settled.pending.wei == "0"
    # The data node's range says 2 units were certified; the claim paid them.
    amount = reward_wei(10**18, 2, 7)
    claim = ClaimRecord(0, DN, 2, "confirmed", amount, b"\x01" * 32, None)
    paid = (RewardPaid(0, DN, 2, amount, b"\x01" * 32),)
    (claimed,) = earnings_of(1, {0: {DN: 3}}, [claim], view(800, paid=paid))
    assert claimed.units_certified == 2 and int(claimed.claimed.wei) == amount
    assert claimed.chain_claimed == claimed.claimed and claimed.claimable.wei == "0"


def test_a_confirmed_claim_shows_its_epoch_settled_whatever_an_older_chain_read_says() -> None:
    # The chain was read while the epoch was still certifying; the claim confirmed since.
    amount = reward_wei(10**18, 3, 7)
    claim = ClaimRecord(0, DN, 3, "confirmed", amount, b"\x01" * 32, None)
    (epoch,) = earnings_of(1, {0: {DN: 3}}, [claim], view(220))
    assert epoch.phase == "settled" and int(epoch.claimed.wei) == amount
    (unclaimed,) = earnings_of(1, {0: {DN: 3}}, [], view(220))
    assert unclaimed.phase == "certifying"


def test_a_claim_refused_for_a_slash_counts_as_challenged_and_pays_nothing() -> None:
    refused = ClaimRecord(0, DN, 3, "failed", 0, None, "ClaimantConvicted: the node was convicted")
    (epoch,) = earnings_of(1, {0: {DN: 3}}, [refused], view(800))
    assert epoch.units_challenged == 3
    assert (epoch.claimed.wei, epoch.claimable.wei) == ("0", "0")


def test_an_epoch_without_a_certificate_expects_nothing_yet() -> None:
    unfixed = EpochBook(0, 0, False, 0, 0, False)
    (epoch,) = earnings_of(1, {0: {DN: 3}}, [], view(300, unfixed))
    assert epoch.expected is None and epoch.chain_budget is None and epoch.pending.wei == "0"


def test_each_data_nodes_range_is_its_own_rounded_share() -> None:
    # Certified units from the claim of one data node, countersigned units of the other (not
    # claimed yet): both count, each rounded down as the contract pays them.
    other = "0x" + "ef" * 20
    book = EpochBook(10, 7, True, 0, 0, False)  # 10 wei over 7 units: rounding shows
    claim = ClaimRecord(0, DN, 2, "confirmed", reward_wei(10, 2, 7), b"\x01" * 32, None)
    (epoch,) = earnings_of(1, {0: {DN: 3, other: 2}}, [claim], view(800, book))
    assert int(epoch.expected.wei) == 2 * reward_wei(10, 2, 7) == 4  # type: ignore[union-attr]
    assert reward_wei(10, 4, 7) == 5  # one share of both would be more than is paid
    assert int(epoch.claimable.wei) == reward_wei(10, 2, 7)
    assert epoch.units_worked == 5 and epoch.units_certified == 2


def test_a_claim_refused_for_good_or_uncertified_expects_nothing_more() -> None:
    over = ClaimRecord(0, DN, 3, "failed", 0, None, "ClaimPeriodOver: the claim period is over")
    uncertified = ClaimRecord(0, "0x" + "ef" * 20, 0, "uncertified", 0, None, None)
    (epoch,) = earnings_of(1, {0: {DN: 3, uncertified.data_node: 4}}, [over, uncertified],
                           view(800))  # fmt: skip
    assert epoch.expected is not None and epoch.expected.wei == "0"
    assert epoch.units_challenged == 0 and epoch.claimable.wei == "0"
    # The uncertified part was missed; the refused one was not (a certificate covered it).
    assert epoch.phase == "settled" and epoch.units_missed == 4
    assert (
        epoch.missed == f"no certificate from data node {uncertified.data_node} before "
        "submissions closed"
    )


def test_work_a_certificate_left_out_is_missed_and_expects_nothing() -> None:
    left_out = ClaimRecord(0, DN, 0, "not certified", 0, None, None)
    (epoch,) = earnings_of(1, {0: {DN: 3}}, [left_out], view(800))
    assert epoch.phase == "missed" and epoch.units_missed == epoch.units_worked == 3
    assert epoch.missed == f"data node {DN}'s certificate leaves out this node's hops"
    assert epoch.expected is not None and epoch.expected.wei == epoch.claimable.wei == "0"


def test_once_submissions_close_a_data_node_without_a_certificate_is_missed() -> None:
    # Before the node's claims run: the chain's certificates of the closed epoch say it.
    other = "0x" + "ef" * 20
    closed = ChainView(300, {0: TIMES}, {0: BOOK}, (), certified_by={0: frozenset({DN})})
    (epoch,) = earnings_of(1, {0: {DN: 3, other: 2}}, [], closed)
    assert epoch.phase == "disputable" and epoch.units_missed == 2
    assert epoch.missed is not None and other in epoch.missed
    assert int(epoch.pending.wei) == reward_wei(10**18, 3, 7)  # the certified part only
    nobody = ChainView(300, {0: TIMES}, {0: BOOK}, (), certified_by={0: frozenset()})
    (epoch,) = earnings_of(1, {0: {DN: 3}}, [], nobody)
    assert epoch.phase == "missed" and epoch.pending.wei == "0"
    # While submissions are open nothing is known to be missed.
    (epoch,) = earnings_of(1, {0: {DN: 3}}, [], view(220))
    assert epoch.phase == "certifying" and epoch.missed is None and epoch.units_missed == 0


def test_amounts_in_eth_are_exact_for_any_uint256() -> None:
    from gwtf.api.schemas import Amount

    assert (Amount.of(0).eth, Amount.of(1).eth, Amount.of(15 * 10**17).eth) == (
        "0", "0.000000000000000001", "1.5",
    )  # fmt: skip
    largest = Amount.of(2**256 - 1)
    whole, fraction = largest.eth.split(".")
    assert int(whole + fraction.ljust(18, "0")) == 2**256 - 1 == int(largest.wei)


def test_the_next_claim_is_when_the_oldest_epoch_with_a_reward_to_come_settles() -> None:
    later = EpochTimes(200, 300, 350, 900)
    times = {0: TIMES, 1: later}
    chain = ChainView(250, times, {0: BOOK, 1: BOOK}, ())
    # Epoch 0 (disputable) still settles: claimable from its settle time, 800.
    epochs = earnings_of(1, {0: {DN: 3}, 1: {DN: 2}}, [], chain)
    assert next_claim_at(epochs, times, later) == TIMES.settles_at == 800
    # Epoch 0 missed: nothing comes of it, so epoch 1's settle time.
    missed = replace(chain, now=400, certified_by={0: frozenset()})
    epochs = earnings_of(1, {0: {DN: 3}, 1: {DN: 2}}, [], missed)
    assert next_claim_at(epochs, times, later) == later.settles_at
    # Settled and not claimed yet: claimable now (a time past).
    epochs = earnings_of(1, {0: {DN: 3}}, [], view(850))
    assert next_claim_at(epochs, {0: TIMES}, later) == 800 < 850
    # Claimed already, or no work at all: when the epoch running now settles.
    assert next_claim_at([], {}, later) == 900
    assert next_claim_at([], {}, None) is None


def test_the_status_counts_down_to_the_next_claim_on_the_chains_clock() -> None:
    # The chain (a devnet's, moved on) said 5,000 when read 4 s ago; its reward settles at 5,060.
    chain = ChainParts(ChainView(5_000, {}, {}, ()), (), (), 0, 0, 5_060, read_at=1_000.0)
    assert next_claim(chain, 1_004.0) == {"next_claim_at": 5_060, "next_claim_in_s": 56}
    assert next_claim(chain, 1_100.0)["next_claim_in_s"] == 0
    assert next_claim(None, 1_004.0) == {"next_claim_at": None, "next_claim_in_s": None}
