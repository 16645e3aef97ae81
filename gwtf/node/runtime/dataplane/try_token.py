"""The origin's try token: a forward of a microbatch is taken only as part of a try its origin
started.

A forward's sender is checked only against the last entry of the path it claims, and microbatch
ids are predictable, so without more any run member could send a relay (or the origin, which
computes the loss) a forward of a microbatch made up from an input of its choosing. Arriving
before the real one, it would be computed and the real one declined as a second forward of the
microbatch (``roles/held_forward.py``): the training poisoned, unnoticed.

So at the start of each try of a microbatch (its first send, and each restart: the first
attempt of a new block, ``hop.origin_attempt``) the origin signs, with its node key, the run,
the iteration, the microbatch and the try's first attempt. Every forward of the try carries the
token (``HopHeader.try_start`` and ``try_signature``): a relay copies the one it received onto
the forward it sends on, onto its re-sends and onto the repairs it serves, as the origin does
onto its own. A receiver takes a forward only when the token was signed by the header's origin
over that header's run, iteration and microbatch, with a try start no later than the header's
attempt (re-sends and repairs of a try take attempts above its start). Anything else is the
sender's fault (an honest sender passes on only a token it checked) and is refused as a
protocol error, nothing computed.

The origin must be a data node the chain names in the run (``DataPlane.origins``), or any run
member could name itself the origin and sign a token of its own. Then a node off the
microbatch's path never sees its token and cannot make a forward of it up. A
colluder the routing put on the path can leak it; a forward made up with it is then the
accomplice's work, chained to no send of the data node, so never certified. A token names a
try's start, not the latest try, and a relay cannot tell the latest without asking: one seen on
the path of a try given up stays good at relays after a restart. The origin knows its tries, so
it takes for the loss only a forward of the try in flight (``roles/data.py``; a late copy of an
old try is declined, not charged); a made-up forward computed at a relay with an old token never
reaches the loss, and the new try's forward replaces it there, whatever attempt it names: a
relay compares the token's start, not the attempt, with the origin's latest try
(``roles/held_forward.py``).

The signature is EIP-712 under its own domain name and type, so it can never pass for a hop
receipt or any other message this key signs. The domain binds it to the run's chain and
WorkLedger (``try_token_domain``, from the composition root, as hop receipts' ``ledger_domain``):
a node key used in two deployments (a testnet and a mainnet, or two ledgers on one chain) signs
tokens for run N in each that the other refuses, though the run ids match. A swarm on no chain
signs under ``NO_CHAIN_TRY_DOMAIN`` (chain id 0, the zero address), which a chain-bound receiver
refuses too. Checking costs one ECDSA recovery, once per (origin, iteration, microbatch, try
start, signature) on each receiver: the valid ones are kept in a small bounded table.
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Final

from libp2p.peer.id import ID

from gwtf.contracts.encoding import (
    Eip712Domain,
    recover_digest_signer,
    sign_digest,
    typed_data_digest,
)
from gwtf.contracts.keccak import keccak256
from gwtf.errors import ProtocolError
from gwtf.node.p2p.identity import node_address_of_peer
from gwtf.node.runtime.dataplane.hop import FORWARD, HopHeader

TRY_TOKEN_DOMAIN_NAME: Final = "GWTF try token"
TRY_TOKEN_DOMAIN_VERSION: Final = "1"
#: The domain of a swarm on no chain (no admission, no receipts): bound to nothing.
NO_CHAIN_TRY_DOMAIN: Final = Eip712Domain(
    TRY_TOKEN_DOMAIN_NAME, TRY_TOKEN_DOMAIN_VERSION, 0, "0x0000000000000000000000000000000000000000"
)
TRY_TOKEN_TYPE: Final = "TryToken(uint64 run,uint64 iteration,uint64 microbatch,uint16 tryStart)"
_TRY_TOKEN_TYPE_HASH: Final = keccak256(TRY_TOKEN_TYPE.encode())
#: Valid tokens kept: a receiver holds at most its in-flight microbatches' tries.
MAX_CHECKED_TOKENS: Final = 4096


class TryTokenError(ProtocolError):
    """A forward whose try token is missing or not its origin's for that hop."""


def try_token_domain(chain_id: int, ledger_address: str) -> Eip712Domain:
    """The domain of a run's try tokens: its WorkLedger at ``ledger_address`` on ``chain_id``."""
    return Eip712Domain(TRY_TOKEN_DOMAIN_NAME, TRY_TOKEN_DOMAIN_VERSION, chain_id, ledger_address)


def try_token_digest(
    domain: Eip712Domain, run_id: int, iteration: int, microbatch: int, try_start: int
) -> bytes:
    """The EIP-712 digest an origin signs, under ``domain``, for one try of one microbatch."""
    if not (run_id | iteration | microbatch) >> 64 == try_start >> 16 == 0 or try_start < 0:
        raise TryTokenError("a try token's run, iteration and microbatch are u64, its start u16")
    # abi.encode of static uints: each a 32-byte big-endian word (as eth_abi's ``encode``,
    # which costs as much as the recovery itself)
    words = b"".join(v.to_bytes(32, "big") for v in (run_id, iteration, microbatch, try_start))
    return typed_data_digest(domain, keccak256(_TRY_TOKEN_TYPE_HASH + words))


def sign_try(header: HopHeader, node_key: bytes, domain: Eip712Domain) -> HopHeader:
    """``header``, a try's first forward at its origin, with the try's token under ``domain``
    (the run's: ``DataPlane.try_domain``): its attempt is the try's start."""
    if len(node_key) != 32:
        raise ProtocolError(
            "a data node signs its tries with its node key; give its DataPlane one (node_key)"
        )
    digest = try_token_digest(
        domain, header.run_id, header.iteration, header.microbatch_id, header.attempt
    )
    return header.onward(try_start=header.attempt, try_signature=sign_digest(digest, node_key))


@functools.lru_cache(maxsize=256)
def origin_address(origin: str) -> str:
    """The node address of a hop's origin peer id (cached: a run has few data nodes)."""
    try:
        return node_address_of_peer(ID.from_base58(origin))
    except Exception as exc:  # base58, multihash and key decoding errors, or no secp256k1 key
        raise TryTokenError(f"hop origin {origin[:20]!r} is not a node's peer id") from exc


@dataclass
class TryTokens:
    """A receiver's check of forwards' try tokens under its run's ``domain``, with the valid
    ones it has seen."""

    domain: Eip712Domain = NO_CHAIN_TRY_DOMAIN
    max_checked: int = MAX_CHECKED_TOKENS
    _valid: OrderedDict[tuple[str, int, int, int, int, bytes], None] = field(
        default_factory=OrderedDict
    )

    def check(self, header: HopHeader) -> None:
        """Raise ``TryTokenError`` unless ``header`` (a forward) carries a token its origin
        signed for its run, iteration and microbatch, starting no later than its attempt."""
        if header.direction != FORWARD:
            return
        microbatch = header.microbatch_id
        if not header.try_signature:
            raise TryTokenError(
                f"forward of microbatch {microbatch} without its try token; a node sends on the "
                "token of the forward it computed from"
            )
        if header.try_start > header.attempt:
            raise TryTokenError(
                f"forward of microbatch {microbatch} at attempt {header.attempt} carries the "
                f"token of a try starting at {header.try_start}"
            )
        key = (
            header.origin,
            header.run_id,
            header.iteration,
            microbatch,
            header.try_start,
            header.try_signature,
        )
        if key in self._valid:
            self._valid.move_to_end(key)
            return
        digest = try_token_digest(
            self.domain, header.run_id, header.iteration, microbatch, header.try_start
        )
        try:
            signer = recover_digest_signer(digest, header.try_signature)
        except ProtocolError as exc:
            raise TryTokenError(f"forward of microbatch {microbatch}: try token {exc}") from exc
        if signer != origin_address(header.origin):
            raise TryTokenError(
                f"forward of microbatch {microbatch} carries a try token its origin did not "
                f"sign for this run on chain {self.domain.chain_id} (ledger "
                f"{self.domain.verifying_contract}); every node of a run names one chain"
            )
        self._valid[key] = None
        while len(self._valid) > self.max_checked:
            self._valid.popitem(last=False)

    def __len__(self) -> int:
        return len(self._valid)
