"""A second forward of a microbatch a relay holds replaces the held one only when the
microbatch's origin has started the microbatch again since.

A relay keeps one forward per microbatch: its saved activations are what the microbatch's
gradient goes through. A forward's sender is checked only against the last entry of the path
it claims and the try token it carries (``dataplane/try_token.py``), so a node that has the
token (on the microbatch's path, or told by a colluder there) can send a relay a forward of a
microbatch it holds, made up from an input of its choosing. Computed, it would replace the
held activations, and the real gradient, coming back along the real path, would go through the
made-up input: the stage's weights poisoned, unnoticed (the relay's backward is receipted
through its own whole forward receipt of that input, which a juror accepts).

Honest second forwards exist, and must still work:

* a restart: the origin gives up a stalled microbatch and starts it again under a new block of
  attempts (``hop.origin_attempt``). Its forward may meet a relay that still holds the old
  try's, from an input that differs in its last bits when another replica upstream computed it
  (one standing in for the relay that died, on other hardware). The old try's activations are
  dead and must be replaced, or a stage with one replica would decline the restart for ever;
* a copy: a sender that missed a slow relay's ack re-sends to another replica and both send
  on, possibly to the same relay; a resume re-sends a held output. From the same input a copy
  gives the same activations.

The rule (``check_second_forward``): a second forward from the input held is computed as
before (the same weights and input: the same activations, nothing changes). One from another
input replaces the held one only when the microbatch's origin says (``control.CurrentTry``)
that its latest try started where the new one's try token says its try started (the origin
signed that start; the attempt, below the first attempt it has not handed out, ``issued``, is
the sender's to pick), and that the held forward's try started before or its attempt is not
below ``issued``: the held forward belongs to a try the origin gave up, or carries a number
nobody handed out (made up first under the top attempt, it would otherwise outrank every
restart). So a forward made up with a given-up try's token, whatever attempt it names, never
replaces a held one, and the new try's own forward replaces it where it got first. Any other
is declined: the held forward
belongs to the try in progress, which a copy from another input adds nothing to (the held one
went on already) and a made-up one must not touch. A repair (``FLAG_REPAIR``) from another input
is declined without asking: a repair goes to a relay that lacks the microbatch, and its sender
then tries another replica.

Why this design rather than keeping activations per input and having each backward name the
input it goes through: that would change the hop's wire format and hold two sets of
activations per microbatch under attack, where this costs honest nodes one control round trip
to the origin, only when a held microbatch meets another input (a restart through other
hardware). The origin numbers the tries itself, so it alone can tell a restart from a made-up
forward: nobody upstream of the relay signs the attempt a hop carries.

Declined, never charged: the relay cannot tell which of the two forwards is the made-up one (it
may hold the made-up one, if that came first), and the verdict rests on the origin's word,
which must not get honest relays scored down. A made-up forward that reaches a relay before the
real one (or, after a restart, before the restarted one) is outside this rule: it replaces
nothing held. The try token keeps it from any node off the microbatch's path; one made up with a
leaked token is its maker's work, chained to none of the origin's sends, never certified.

Why a relay keys what it holds by (iteration, microbatch), not by origin too: with several data
nodes in a run, a microbatch id names one data node's microbatch. Each data node starts the ids
of its own shard of each iteration (``data_peers.shard_microbatches``: distinct shards and
iterations never share one), the data nodes refuse to start when two claim one shard
(``DataPeers``), and a data node taking a shard over starts at the iteration after it joined.
So honest data nodes' ids never collide, and the relay's stage worker, its accumulated gradient
and the gradient redo (``Holds`` asks for a range of ids) all name a microbatch by its id alone.
A data node that breaks this on purpose, starting ids of another's shard under its own try
tokens, replaces nothing held: a second forward of another origin is declined above, unasked.
It can still be first to a relay with an id of another data node, which then has that id
declined there (it stalls, or goes through another replica): a denial of service by a data
node the chain names, not a way to replace another data node's activations. Keying every part
of a relay by origin would end it, at the cost of the stage worker's and the control
protocol's microbatch ids.
"""

from __future__ import annotations

import logging
from typing import Protocol

from gwtf.errors import ProtocolError
from gwtf.node.p2p.rpc import Decline, RequestResponse
from gwtf.node.runtime.dataplane import control
from gwtf.node.runtime.dataplane.hop import FLAG_REPAIR, HopHeader

log = logging.getLogger(__name__)


class AskTry(Protocol):
    """Ask a microbatch's origin (origin, iteration, microbatch) for the first attempt of the
    microbatch's latest try and the first attempt it has not handed out: None when it says
    nothing usable (silent, refusing, or past its deadline, which bounds the wait). Does not
    raise."""

    async def __call__(
        self, origin: str, iteration: int, microbatch: int, /
    ) -> tuple[int, int] | None: ...


async def check_second_forward(
    held: HopHeader, held_input: bytes, header: HopHeader, input_digest: bytes, ask_try: AskTry
) -> None:
    """Decline the forward ``header`` (of input ``input_digest``) of a microbatch whose forward
    ``held`` (of input ``held_input``) this relay holds, unless it may replace it."""
    if input_digest == held_input:
        return
    microbatch = header.microbatch_id
    if header.flags & FLAG_REPAIR:
        raise Decline(
            f"microbatch {microbatch}'s forward is held here from another input; a repair goes "
            "to a relay that lacks it"
        )
    if header.origin == held.origin:
        answer = await ask_try(held.origin, header.iteration, microbatch)
        started, issued = answer if answer is not None else (0, 0)
        # The try token's start is the origin's signature (checked on receipt); the attempt is
        # the sender's to pick, so it tells no try from another.
        latest = header.try_start == started <= header.attempt < issued
        earlier = held.try_start < started or held.attempt >= issued
        if latest and earlier:
            log.info(
                "microbatch %s restarted at attempt %s: its old forward is replaced",
                microbatch,
                started,
            )
            return
    raise Decline(
        f"microbatch {microbatch}'s forward is held here from another input, and its origin "
        "has not started it again since; send it to another replica"
    )


async def ask_current_try(
    rpc: RequestResponse, origin: str, iteration: int, microbatch: int, timeout_s: float
) -> tuple[int, int] | None:
    """The first attempt of the microbatch's latest try and the first not handed out, asked of
    its origin; None when the origin does not say (unreachable, not in flight there, a
    malformed reply)."""
    request = control.CurrentTry(iteration, microbatch)
    try:
        reply = control.decode_reply(await control.ask(rpc, origin, request, timeout_s))
    except ProtocolError as exc:
        log.info("origin %s did not say microbatch %s's try: %s", origin, microbatch, exc)
        return None
    attempt, issued = reply.get("attempt"), reply.get("issued")
    if not reply["ok"] or type(attempt) is not int or type(issued) is not int:
        return None
    if not 0 <= attempt < issued:
        return None
    return attempt, issued
