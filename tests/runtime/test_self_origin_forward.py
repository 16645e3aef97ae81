"""A run member off a microbatch's path cannot make its forward up by naming itself its origin.

A live swarm on loopback: data node, stage-1 relays ``a`` and ``m``, stage-2 relay ``b``. As the
data node starts microbatch X, the stage-1 relay X is not sent to sends ``b`` a forward of X
made up from an input of its own, before the real one, naming itself X's origin and carrying a
try token it signed itself: the token is then its origin's, but the origin is no data node of
the run. Computed, ``b`` would hold the made-up forward, decline X's real one (held from another
input, of another origin) and each of its restarts, and a gradient the attacker sends back as
the made-up microbatch's sink would go into ``b``'s weights. The relays ask a real chain
(eth-tester) whether a forward's origin is a data node of the run: ``b`` refuses the made-up
forward and charges its sender.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio
from eth_account import Account

from gwtf.node.chain.actions import Capacity, add_data_node, register_node
from gwtf.node.chain.adapter import Sender
from gwtf.node.p2p.identity import identity_from_key
from gwtf.node.p2p.rpc import PeerUnavailable, RequestDeclined
from gwtf.node.p2p.scoring import Offence
from gwtf.node.runtime.dataplane.hop import HopHeader
from gwtf.node.runtime.dataplane.try_token import sign_try, try_token_domain
from gwtf.node.runtime.discovery.admission import RunAdmission
from gwtf.node.runtime.roles.data import DataRole
from tests.runtime.conftest import ETH
from tests.runtime.swarm_harness import (
    _IDENTITIES,
    Swarm,
    run_swarm,
)
from tests.runtime.test_made_up_forward import (
    BATCH,
    ITERATIONS,
    RELAYS,
    noise_frame,
    trains_like_the_whole_model,
)


def test_a_forward_naming_its_sender_as_origin_is_refused_and_charged(
    tmp_path: Path, chain: tuple[Any, int]
) -> None:
    contracts, run_id = chain
    data_key = Account.create()
    sponsor = Sender.unlocked(contracts.w3.eth.accounts[1])
    register_node(contracts, sponsor, bytes(data_key.key), Capacity("cpu", 1, 1, 1), 2 * ETH)
    add_data_node(contracts, sponsor, run_id, data_key.address)
    _IDENTITIES[(tmp_path, "data")] = identity_from_key(bytes(data_key.key))
    origins = RunAdmission(contracts.port(), run_id).is_data_node
    # Every node signs and checks try tokens under the run's chain and ledger.
    domain = try_token_domain(contracts.w3.eth.chain_id, contracts.ledger.address)
    bound = {"run_id": run_id, "try_domain": domain}
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
            if not attackers and header.iteration == 0:
                name = "m" if to == swarm.nodes["a"].plane.node_id else "a"
                attackers.append(name)
                attacker, relay_b = swarm.nodes[name], swarm.nodes["b"].plane.node_id
                me = attacker.plane.node_id
                made_up_frame = noise_frame(attacker, header.microbatch_id)
                # X's id, its own origin and a token of its own: valid, and for X's slot at b.
                own = header.onward(origin=me, stage=2, path=(me, me))
                made_up = sign_try(own, attacker.plane.node_key, attacker.plane.try_domain)
                try:
                    await attacker.plane.send(relay_b, made_up, made_up_frame)
                    outcome.append("computed")
                except RequestDeclined as exc:
                    outcome.append(f"declined: {exc}")
                except PeerUnavailable as exc:
                    outcome.append("refused" if "origin" in str(exc) else str(exc))
            return await send_forward(header, frame, to, input_digest, *route)

        data.sender.send_forward = attack_first  # type: ignore[method-assign]

    async def main() -> list:  # type: ignore[type-arg]
        with trio.fail_after(120):
            return await run_swarm(
                tmp_path, ITERATIONS, BATCH, RELAYS, arm, swarm,
                relay_settings={"origins": origins, **bound},
                data_settings=bound,
            )  # fmt: skip

    results = trio.run(main)
    assert all(node.plane.try_domain == domain for node in swarm.nodes.values())
    assert outcome == ["refused"]
    attacker = swarm.nodes[attackers[0]].plane.node_id
    assert Offence.MALFORMED_MESSAGE in swarm.nodes["b"].rpc.scores.offences[attacker]
    trains_like_the_whole_model(swarm, results)
