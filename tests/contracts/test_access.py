"""Who may call what: one table, every role tried against every restricted function (simulated
with eth_call from each account); the allowed role passes the access check, all others get the
access error with their own address."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from contracts.bindings import ContractRevert, call
from tests.contracts.world import ETH, World, default_capacity

ROLES = ("owner", "sponsor", "wallet_a", "wallet_b", "challenger", "stranger", "ledger", "registry")


@dataclass(frozen=True)
class Rule:
    function: str
    allowed: frozenset[str]  # empty: anyone
    build: Callable[[World, dict[str, Any]], Any]
    error: str = ""
    error_args: Callable[[dict[str, Any], str], tuple[Any, ...]] = lambda ctx, caller: ()
    value_wei: int = 0


def not_wallet(ctx: dict[str, Any], caller: str) -> tuple[Any, ...]:
    return (ctx["a"].address, caller)


def not_sponsor(ctx: dict[str, Any], caller: str) -> tuple[Any, ...]:
    return (ctx["run"], caller)


RULES = [
    Rule(
        "registry.setLedger",
        frozenset({"owner"}),
        lambda w, c: w.registry.functions.setLedger(w.stranger),
        "OwnableUnauthorizedAccount",
        lambda c, caller: (caller,),
    ),
    Rule(
        "registry.slash",
        frozenset({"ledger"}),
        lambda w, c: w.registry.functions.slash(c["a"].address),
        "NotLedger",
        lambda c, caller: (caller,),
    ),
    Rule(
        "registry.addStake",
        frozenset({"wallet_a"}),
        lambda w, c: w.registry.functions.addStake(c["a"].address),
        "NotNodeWallet",
        not_wallet,
        value_wei=1,
    ),
    Rule(
        "registry.updateCapacity",
        frozenset({"wallet_a"}),
        lambda w, c: w.registry.functions.updateCapacity(c["a"].address, default_capacity()),
        "NotNodeWallet",
        not_wallet,
    ),
    Rule(
        "registry.requestUnstake",
        frozenset({"wallet_a"}),
        lambda w, c: w.registry.functions.requestUnstake(c["a"].address),
        "NotNodeWallet",
        not_wallet,
    ),
    Rule(
        "registry.withdrawStake",
        frozenset({"wallet_a"}),
        lambda w, c: w.registry.functions.withdrawStake(c["a"].address),
        "NotNodeWallet",
        not_wallet,
    ),
    Rule(
        "ledger.fundRun",
        frozenset({"sponsor"}),
        lambda w, c: w.ledger.functions.fundRun(c["run"]),
        "NotSponsor",
        not_sponsor,
        value_wei=1,
    ),
    Rule(
        "ledger.closeRun",
        frozenset({"sponsor"}),
        lambda w, c: w.ledger.functions.closeRun(c["run"]),
        "NotSponsor",
        not_sponsor,
    ),
    Rule(
        "ledger.withdrawRefund",
        frozenset({"sponsor"}),
        lambda w, c: w.ledger.functions.withdrawRefund(c["run"]),
        "NotSponsor",
        not_sponsor,
    ),
    Rule(
        "ledger.joinRun",
        frozenset({"wallet_a"}),
        lambda w, c: w.ledger.functions.joinRun(c["run"], c["a"].address),
        "NotNodeWallet",
        not_wallet,
    ),
    Rule(
        "ledger.leaveRun",
        frozenset({"wallet_a"}),
        lambda w, c: w.ledger.functions.leaveRun(c["run"], c["a"].address),
        "NotNodeWallet",
        not_wallet,
    ),
    Rule(
        "ledger.submitEpochRoot",
        frozenset({"wallet_a"}),
        lambda w, c: w.ledger.functions.submitEpochRoot(
            c["run"], 0, c["a"].address, b"\x01" * 32, 1, 100
        ),
        "NotNodeWallet",
        not_wallet,
    ),
    Rule(
        "ledger.claimReward",
        frozenset({"wallet_a"}),
        lambda w, c: w.ledger.functions.claimReward(
            (c["run"], 0, c["a"].address, b"\x01" * 32, 1, 100)
        ),
        "NotNodeWallet",
        not_wallet,
    ),
    Rule(
        "ledger.openRun",
        frozenset(),
        lambda w, c: w.ledger.functions.openRun(w.run_config()),
        value_wei=ETH,
    ),
]


@pytest.fixture
def access_world(world: World) -> tuple[World, dict[str, Any]]:
    def build() -> dict[str, Any]:
        a = world.register("a", world.wallet(0))
        b = world.register("b", world.wallet(1))
        run = world.open_run()
        world.join(run, b, world.wallet(1))
        world.to_submission(run, 0)  # so that submitEpochRoot gets as far as its access check
        return {"a": a, "b": b, "run": run}

    return world, world.scenario("access", build)


def address_of(w: World, role: str) -> str:
    return {
        "owner": w.deployer,
        "sponsor": w.sponsor,
        "wallet_a": w.wallet(0),
        "wallet_b": w.wallet(1),
        "challenger": w.challenger,
        "stranger": w.stranger,
        "ledger": w.ledger.address,
        "registry": w.registry.address,
    }[role]


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.function)
def test_access_table(access_world: tuple[World, dict[str, Any]], rule: Rule) -> None:
    w, ctx = access_world
    for role in ROLES:
        caller = address_of(w, role)
        allowed = not rule.allowed or role in rule.allowed
        try:
            call(rule.build(w, ctx), caller, rule.value_wei)
            outcome: tuple[str, tuple[Any, ...]] | None = None
        except ContractRevert as revert:
            outcome = (revert.name, revert.args)
        if allowed:
            # The allowed role may still fail on state (e.g. nothing to withdraw), never on access.
            assert outcome is None or outcome[0] != rule.error or not rule.error, (role, outcome)
        else:
            assert outcome == (rule.error, rule.error_args(ctx, caller)), (role, outcome)


def test_the_ledger_accepts_ether_only_from_the_registry(
    access_world: tuple[World, dict[str, Any]],
) -> None:
    w, _ = access_world
    for role in ROLES:
        caller = address_of(w, role)
        params = {"from": caller, "to": w.ledger.address, "value": 1}
        if role == "registry":
            w.w3.eth.call(params)  # accepted
            continue
        with pytest.raises(Exception, match="execution reverted"):
            w.w3.eth.call(params)
