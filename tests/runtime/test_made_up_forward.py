"""A made-up forward of a microbatch is never computed in place of the real one.

A live swarm on loopback: data node, stage-1 relays ``a`` and ``m``, stage-2 relay ``b``.

* Held: once ``b`` has sent microbatch X's forward on to the loss, and before X's gradient
  comes back, run member ``m`` sends ``b`` a forward of X from an input of its own, claiming to
  be X's stage-1 node and a restart (the origin's next block of attempts), with X's try token
  (leaked by a colluder on X's path). Computed, it would replace ``b``'s saved activations, and
  X's real gradient would go through the made-up input: ``b``'s weights (and through its
  gradient ``a``'s or ``m``'s) poisoned. ``b`` asks X's origin, which started no later try, and
  declines it.
* Arriving first: as the data node starts microbatch X, the stage-1 relay X is not sent to
  sends ``b`` and the origin (which computes the loss) made-up forwards of X, before the real
  one: without X's try token it cannot make one up (``dataplane/try_token.py``); each is
  refused and charged to it, and the real forward is computed.

Either way the swarm trains exactly like the whole model, and ``b``'s stage is the whole
model's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import trio

from gwtf.node.p2p.rpc import PeerUnavailable, RequestDeclined
from gwtf.node.p2p.scoring import Offence
from gwtf.node.runtime.dataplane.hop import ATTEMPT_BLOCK, FORWARD, HopHeader
from gwtf.node.runtime.dataplane.sender import PassedBack
from gwtf.node.runtime.dataplane.try_token import sign_try
from gwtf.node.runtime.live_node import LiveNode
from gwtf.node.runtime.roles.data import DataRole
from gwtf.node.runtime.roles.flow_pool import Flow
from gwtf.node.runtime.roles.held_forward import ask_current_try
from gwtf.node.runtime.roles.relay import RelayRole
from gwtf.node.training import codec
from tests.runtime.swarm_harness import (
    BATCH_SIZE,
    MODEL,
    SEQ_LEN,
    Swarm,
    reference_run,
    run_swarm,
)

ITERATIONS = 2
BATCH = 4
RELAYS = {"a": 1, "m": 1, "b": 2}


def noise_frame(attacker: LiveNode, microbatch_id: int) -> bytes:
    """A forward's frame of ``microbatch_id`` made up by ``attacker`` (a relay): seeded noise in
    the shape of the stage's activations, not computed from any input."""
    seeded = torch.Generator().manual_seed(7)
    noise = torch.randn(BATCH_SIZE, SEQ_LEN, MODEL.d_model, generator=seeded)
    assert isinstance(attacker.role, RelayRole)
    return codec.encode(microbatch_id, noise, attacker.role.limits)


def test_a_made_up_forward_of_a_held_microbatch_leaves_the_stage_as_an_honest_run_would(
    tmp_path: Path,
) -> None:
    swarm = Swarm()
    outcome: list[str] = []

    async def arm(swarm: Swarm) -> None:
        while not {"data", *RELAYS} <= set(swarm.nodes):
            await trio.sleep(0.01)
        data, attacker = swarm.nodes["data"].role, swarm.nodes["m"]
        assert isinstance(data, DataRole)
        send_backward = data.sender.send_backward_or_log

        async def attack_first(record: PassedBack) -> None:
            """The sink's first gradient waits until ``m`` has sent its made-up forward."""
            real = record.header
            if not outcome and real.iteration == 0:
                outcome.append("sending")
                relay_b = real.path[2]  # computed X's forward: holds it now
                made_up = HopHeader(
                    real.run_id, 0, real.microbatch_id, real.attempt + ATTEMPT_BLOCK, FORWARD,
                    2, 0, 0, real.origin, (real.origin, attacker.plane.node_id), "", real.epoch,
                    real.try_start, real.try_signature,  # leaked by a colluder on X's path
                )  # fmt: skip
                frame = noise_frame(attacker, real.microbatch_id)
                try:
                    await attacker.plane.send(relay_b, made_up, frame)
                    outcome[0] = "computed"
                except RequestDeclined:
                    outcome[0] = "declined"
                # What b asked: X's origin names its only try, started at attempt 0.
                asked = await ask_current_try(attacker.rpc, real.origin, 0, real.microbatch_id, 2.0)
                outcome.append(f"try {asked and asked[0]}")
            await send_backward(record)

        data.sender.send_backward_or_log = attack_first  # type: ignore[method-assign]

    async def main() -> list:  # type: ignore[type-arg]
        with trio.fail_after(120):
            return await run_swarm(tmp_path, ITERATIONS, BATCH, RELAYS, arm, swarm)

    results = trio.run(main)
    assert outcome == ["declined", "try 0"]
    trains_like_the_whole_model(swarm, results)


def test_a_made_up_forward_arriving_before_the_real_one_is_refused_and_charged(
    tmp_path: Path,
) -> None:
    swarm = Swarm()
    outcome: list[str] = []
    attackers: list[str] = []

    async def arm(swarm: Swarm) -> None:
        while not {"data", *RELAYS} <= set(swarm.nodes):
            await trio.sleep(0.01)
        data = swarm.nodes["data"].role
        assert isinstance(data, DataRole)
        send_forward = data.sender.send_forward

        async def attack_first(
            header: HopHeader, frame: bytes, to: str, input_digest: bytes, *route: Any
        ) -> str:
            """X's first hop waits until the stage-1 relay off its path has sent its made-up
            forwards of X to ``b`` and to the origin."""
            if not attackers and header.iteration == 0:
                name = "m" if to == swarm.nodes["a"].plane.node_id else "a"
                attackers.append(name)
                attacker, relay_b = swarm.nodes[name], swarm.nodes["b"].plane.node_id
                me, origin = attacker.plane.node_id, header.origin
                made_up_frame = noise_frame(attacker, header.microbatch_id)
                # To b, signed with its own key as if the origin's; to the origin, unsigned.
                forged = sign_try(header, attacker.plane.node_key, attacker.plane.try_domain)
                to_b = forged.onward(stage=2, path=(origin, me))
                to_sink = header.onward(stage=3, path=(origin, relay_b, me), try_signature=b"")
                for target, made_up in ((relay_b, to_b), (origin, to_sink)):
                    try:
                        await attacker.plane.send(target, made_up, made_up_frame)
                        outcome.append("computed")
                    except RequestDeclined as exc:
                        outcome.append(f"declined: {exc}")
                    except PeerUnavailable as exc:
                        outcome.append("refused" if "try token" in str(exc) else str(exc))
            return await send_forward(header, frame, to, input_digest, *route)

        data.sender.send_forward = attack_first  # type: ignore[method-assign]

    async def main() -> list:  # type: ignore[type-arg]
        with trio.fail_after(120):
            return await run_swarm(tmp_path, ITERATIONS, BATCH, RELAYS, arm, swarm)

    results = trio.run(main)
    assert outcome == ["refused", "refused"]
    attacker = swarm.nodes[attackers[0]].plane.node_id
    for name in ("b", "data"):  # each charged the attacker for the forward it made up
        assert Offence.MALFORMED_MESSAGE in swarm.nodes[name].rpc.scores.offences[attacker]
    trains_like_the_whole_model(swarm, results)


def test_a_forward_made_up_with_a_given_up_tries_token_never_reaches_the_loss(
    tmp_path: Path,
) -> None:
    """X's first try is given up before it is sent; the stage-1 relay X's new try is not sent
    to holds the old try's token (as a node on that try's path would). As the new try starts,
    it makes up forwards of X with that token: ``b`` computes one (the token is the origin's),
    but its output, like the one sent to the origin directly, is of a try not in flight, which
    the origin declines; the real forward then replaces the made-up one at ``b``."""
    swarm = Swarm()
    outcome: list[str] = []
    given_up: list[int] = []

    async def arm(swarm: Swarm) -> None:
        while not {"data", *RELAYS} <= set(swarm.nodes):
            await trio.sleep(0.01)
        data = swarm.nodes["data"].role
        assert isinstance(data, DataRole)
        run_microbatch, send_forward = data._run_microbatch, data.sender.send_forward

        async def give_up_first_try(
            iteration: int, microbatch_id: int, flow: Flow, attempt: int
        ) -> bool:
            if not given_up and iteration == 0:
                given_up.append(microbatch_id)
                return False  # as if it stalled: started again under the next block
            return await run_microbatch(iteration, microbatch_id, flow, attempt)

        async def attack_first(
            header: HopHeader, frame: bytes, to: str, input_digest: bytes, *route: Any
        ) -> str:
            if not outcome and given_up and header.microbatch_id == given_up[0]:
                assert header.try_start == header.attempt == ATTEMPT_BLOCK
                name = "m" if to == swarm.nodes["a"].plane.node_id else "a"
                attacker, relay_b = swarm.nodes[name], swarm.nodes["b"].plane.node_id
                me, origin = attacker.plane.node_id, header.origin
                old_try = sign_try(
                    header.onward(attempt=0), data.plane.node_key, data.plane.try_domain
                )
                made_up_frame = noise_frame(attacker, header.microbatch_id)
                to_b = old_try.onward(attempt=5, stage=2, path=(origin, me))
                to_sink = old_try.onward(attempt=300, stage=3, path=(origin, relay_b, me))
                for target, made_up in ((relay_b, to_b), (origin, to_sink)):
                    try:
                        await attacker.plane.send(target, made_up, made_up_frame)
                        outcome.append("computed")
                    except RequestDeclined as exc:
                        outcome.append("declined" if "in flight started at" in str(exc) else "?")
            return await send_forward(header, frame, to, input_digest, *route)

        data._run_microbatch = give_up_first_try  # type: ignore[method-assign]
        data.sender.send_forward = attack_first  # type: ignore[method-assign]

    async def main() -> list:  # type: ignore[type-arg]
        with trio.fail_after(120):
            return await run_swarm(tmp_path, ITERATIONS, BATCH, RELAYS, arm, swarm)

    results = trio.run(main)
    assert outcome == ["computed", "declined"]
    trains_like_the_whole_model(swarm, results, restarts=[1, 0])


def trains_like_the_whole_model(
    swarm: Swarm,
    results: list,  # type: ignore[type-arg]
    restarts: list[int] | None = None,
) -> None:
    """The losses are the whole model's, no microbatch restarted (but ``restarts``), and
    ``b``'s weights are the whole model's."""
    reference = reference_run(ITERATIONS, BATCH)
    assert [r.loss for r in results] == pytest.approx(reference.losses, rel=1e-4)
    assert [r.restarts for r in results] == (restarts or [0] * ITERATIONS)

    # b's stage (layers 2 and 3 of the whole model) is what an honest run trains: they differ
    # by about 2e-8 (the order of summation), a gradient through the made-up input by 1e-4.
    relay_b = swarm.nodes["b"].role
    assert isinstance(relay_b, RelayRole) and reference.trainer is not None
    first_layer = relay_b.worker.span.first_layer
    whole = dict(reference.trainer.model.named_parameters())
    for name, weight in relay_b.worker.module.named_parameters():
        _, layer, rest = name.split(".", 2)
        honest = whole[f"body.blocks.{first_layer + int(layer)}.{rest}"]
        torch.testing.assert_close(weight.detach(), honest.detach(), rtol=0, atol=1e-6)
