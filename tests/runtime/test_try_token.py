"""The origin's try token (``gwtf/node/runtime/dataplane/try_token.py``): a forward is taken
only with its origin's signature of its run, iteration, microbatch and a try start no later
than its attempt; valid tokens are checked once and kept in a bounded table."""

from __future__ import annotations

import pytest
import trio
from eth_abi.abi import encode
from eth_utils.crypto import keccak
from libp2p.crypto.ed25519 import create_new_key_pair

from gwtf.contracts.encoding import (
    Eip712Domain,
    ledger_domain,
    recover_digest_signer,
    sign_digest,
    typed_data_digest,
)
from gwtf.errors import ProtocolError
from gwtf.node.p2p.identity import identity_from_key, node_address_of_peer, peer_id_of
from gwtf.node.runtime.dataplane import try_token
from gwtf.node.runtime.dataplane.exchange import DataPlane
from gwtf.node.runtime.dataplane.hop import ATTEMPT_BLOCK, BACKWARD, FORWARD, HopHeader
from gwtf.node.runtime.dataplane.try_token import (
    NO_CHAIN_TRY_DOMAIN,
    TRY_TOKEN_TYPE,
    TryTokenError,
    TryTokens,
    sign_try,
    try_token_digest,
    try_token_domain,
)

LEDGER = "0x" + "ef" * 20
DOMAIN = try_token_domain(31337, LEDGER)  # the run's chain and WorkLedger
KEYS = {name: keccak(text=f"try token {name}") for name in ("origin", "other", "member")}
PEER = {name: str(peer_id_of(identity_from_key(key))) for name, key in KEYS.items()}
FIRST = HopHeader(1, 3, 7, ATTEMPT_BLOCK, FORWARD, 1, 0, 0, PEER["origin"], (PEER["origin"],))
TRY = sign_try(FIRST, KEYS["origin"], DOMAIN)
#: The try's forward at stage 2, sent on by a relay of stage 1 (which copied the token).
ON_PATH = TRY.onward(stage=2, path=(PEER["origin"], PEER["member"]))


def refused(header: HopHeader, tokens: TryTokens | None = None) -> str:
    with pytest.raises(TryTokenError) as caught:
        (TryTokens(DOMAIN) if tokens is None else tokens).check(header)
    return str(caught.value)


def test_the_try_token_is_the_origins_signature_of_its_run_iteration_microbatch_and_start() -> None:
    assert TRY.try_start == ATTEMPT_BLOCK and len(TRY.try_signature) == 65
    digest = try_token_digest(DOMAIN, 1, 3, 7, ATTEMPT_BLOCK)
    assert recover_digest_signer(digest, TRY.try_signature) == node_address_of_peer(
        peer_id_of(identity_from_key(KEYS["origin"]))
    )
    tokens = TryTokens(DOMAIN)
    tokens.check(ON_PATH)
    tokens.check(ON_PATH.onward(attempt=ATTEMPT_BLOCK + 1))  # a re-send within the try
    tokens.check(ON_PATH.onward(attempt=3 * ATTEMPT_BLOCK))  # a repair the origin asked for
    assert len(tokens) == 1


def test_a_forward_without_a_token_is_refused_and_a_backward_is_not_asked_for_one() -> None:
    assert "without its try token" in refused(FIRST.onward(stage=2, path=ON_PATH.path))
    TryTokens(DOMAIN).check(FIRST.onward(direction=BACKWARD, stage=0))


def test_a_token_signed_by_anyone_but_the_headers_origin_is_refused() -> None:
    forged = sign_try(FIRST, KEYS["member"], DOMAIN)  # a run member signs for the origin
    assert "its origin did not sign" in refused(forged.onward(stage=2, path=ON_PATH.path))
    # A real token of another data node's, put on a header naming this origin:
    theirs = sign_try(FIRST.onward(origin=PEER["other"]), KEYS["other"], DOMAIN)
    assert "its origin did not sign" in refused(theirs.onward(origin=PEER["origin"]))


@pytest.mark.parametrize(
    "changes",
    [
        {"microbatch_id": 8},  # the token of microbatch 7 on a made-up forward of 8
        {"iteration": 4},  # of iteration 3 on the next iteration's microbatch
        {"run_id": 2},  # a replay of another run's token
        {"try_start": 0},  # the start named differently than signed
    ],
)
def test_a_token_for_other_hop_facts_is_refused(changes: dict[str, int]) -> None:
    assert "its origin did not sign" in refused(ON_PATH.onward(**changes))


def test_a_token_of_a_try_starting_after_the_attempt_is_refused() -> None:
    later = sign_try(FIRST.onward(attempt=2 * ATTEMPT_BLOCK), KEYS["origin"], DOMAIN)
    assert "token of a try starting at 512" in refused(later.onward(attempt=ATTEMPT_BLOCK))


def test_malformed_signatures_and_origins_are_refused_as_token_errors() -> None:
    high_s = TRY.try_signature[:32] + b"\xff" * 32 + TRY.try_signature[64:]
    for signature in (bytes(65), high_s, TRY.try_signature[:64] + b"\x05"):
        assert "try token" in refused(ON_PATH.onward(try_signature=signature))
    ed25519 = str(peer_id_of(create_new_key_pair()))  # a peer id, but no node's
    assert "not a node's peer id" in refused(ON_PATH.onward(origin=ed25519))


@pytest.mark.parametrize("facts", [(1, 3, 7, 256), (2**64 - 1, 2**64 - 1, 0, 2**16 - 1)])
def test_the_digest_is_eip712s_of_the_try_token_struct(facts: tuple[int, int, int, int]) -> None:
    struct_hash = keccak(
        encode(
            ["bytes32", "uint64", "uint64", "uint64", "uint16"],
            [keccak(text=TRY_TOKEN_TYPE), *facts],
        )
    )
    assert try_token_digest(DOMAIN, *facts) == typed_data_digest(DOMAIN, struct_hash)
    with pytest.raises(TryTokenError, match="u64"):
        try_token_digest(DOMAIN, *facts[:3], 2**16)


def test_the_token_cannot_pass_for_a_receipt_or_another_domains_signature() -> None:
    ledger = ledger_domain(31337, "0x" + "ef" * 20)
    assert DOMAIN.separator() != ledger.separator()
    digest = try_token_digest(DOMAIN, 1, 3, 7, ATTEMPT_BLOCK)
    assert sign_digest(digest, KEYS["origin"]) == TRY.try_signature
    assert digest != try_token_digest(DOMAIN, 1, 3, 7, ATTEMPT_BLOCK + 1)


def test_valid_tokens_are_recovered_once_and_kept_in_a_bounded_table(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    recovered: list[bytes] = []

    def counting(digest: bytes, signature: bytes) -> str:
        recovered.append(digest)
        return recover_digest_signer(digest, signature)

    monkeypatch.setattr(try_token, "recover_digest_signer", counting)
    tokens = TryTokens(DOMAIN, max_checked=3)
    tries = [sign_try(FIRST.onward(microbatch_id=m), KEYS["origin"], DOMAIN) for m in range(5)]
    for header in tries:
        tokens.check(header)
        tokens.check(header.onward(attempt=header.attempt + 1))  # from the table
    assert len(recovered) == 5 and len(tokens) == 3
    tokens.check(tries[4])  # kept
    assert len(recovered) == 5
    tokens.check(tries[0])  # forgotten: checked again
    assert len(recovered) == 6 and len(tokens) == 3
    # A forged token for a try whose real token is kept is not taken from the table.
    forged = sign_try(FIRST.onward(microbatch_id=4), KEYS["member"], DOMAIN)
    assert "its origin did not sign" in refused(forged, tokens)


def test_a_node_does_not_send_a_forward_below_its_tokens_try_start() -> None:
    """Its receiver would refuse it and charge the sender."""
    plane = DataPlane(None, PEER["member"], 1, 2, 1.0, 1 << 20, try_domain=DOMAIN)  # type: ignore[arg-type]
    stale = sign_try(FIRST.onward(attempt=2 * ATTEMPT_BLOCK), KEYS["origin"], DOMAIN)

    async def main() -> None:
        await plane.send(PEER["other"], stale.onward(attempt=ATTEMPT_BLOCK + 1), b"frame")

    with pytest.raises(TryTokenError, match="below its try's start"):
        trio.run(main)


def test_a_data_plane_without_a_node_key_cannot_sign_a_try() -> None:
    with pytest.raises(ProtocolError, match="give its DataPlane one"):
        sign_try(FIRST, b"", DOMAIN)


@pytest.mark.parametrize(
    ("receiver", "why"),
    [
        (try_token_domain(1, LEDGER), "another chain: the node key reused on mainnet"),
        (try_token_domain(31337, "0x" + "ab" * 20), "another deployment on the same chain"),
        (NO_CHAIN_TRY_DOMAIN, "a swarm on no chain"),
    ],
)
def test_a_token_signed_for_one_chain_and_ledger_is_refused_under_another(
    receiver: Eip712Domain, why: str
) -> None:
    """Run 1 exists in both deployments: only the domain tells the tokens apart."""
    words = refused(ON_PATH, TryTokens(receiver))
    assert f"for this run on chain {receiver.chain_id}" in words, why
    # and the other way round: a token of the receiver's domain is refused under the run's
    theirs = sign_try(FIRST, KEYS["origin"], receiver).onward(stage=2, path=ON_PATH.path)
    TryTokens(receiver).check(theirs)
    assert "its origin did not sign" in refused(theirs)


def test_the_data_plane_checks_tokens_under_its_runs_domain() -> None:
    plane = DataPlane(None, PEER["member"], 1, 2, 1.0, 1 << 20, try_domain=DOMAIN)  # type: ignore[arg-type]
    assert plane.try_tokens.domain == DOMAIN
    plane.try_tokens.check(ON_PATH)
    unbound = DataPlane(None, PEER["member"], 1, 2, 1.0, 1 << 20)  # type: ignore[arg-type]
    assert unbound.try_tokens.domain == NO_CHAIN_TRY_DOMAIN
    with pytest.raises(TryTokenError, match="did not sign"):
        unbound.try_tokens.check(ON_PATH)
