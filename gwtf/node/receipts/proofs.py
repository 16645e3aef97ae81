"""A worker keeps the Merkle proof of each of its hops in a data node's certificate on chain.

When it claims, a worker has checked the two ends of its range against the root on chain. It
then asks the data node for the leaves in between (``CERTIFIED`` pages of
``/gwtf/receipts/3.0.0``), checks each one (its own hop, at the index asked, in the tree of
that root) and keeps their proofs. Its operator can then show that any receipt was certified,
and so paid, without trusting the data node or the node's own word: the API serves each
receipt with its proof (``/v1/receipts``).
"""

from __future__ import annotations

from gwtf.contracts.certificate_tree import LeafProof, WorkerRange
from gwtf.contracts.merkle import verify_proof
from gwtf.errors import ProtocolError
from gwtf.node.p2p.rpc import RequestResponse
from gwtf.node.receipts.serving import CERTIFIED, MAX_FETCH, fetch_receipts
from gwtf.node.store.ledger import KeptProof


async def fetch_own_proofs(
    rpc: RequestResponse,
    peer: str,
    run_id: int,
    epoch: int,
    span: WorkerRange,
    root: bytes,
    timeout_s: float,
) -> list[KeptProof]:
    """The proofs of every leaf of ``span`` in the data node's certificate of ``root``."""
    first, count = span.first.hop.index, span.last.hop.index - span.first.hop.index + 1
    if count > MAX_FETCH or first >= 2**32:
        raise ProtocolError(f"a range of {count} leaves from {first} is more than is read")
    fetched = await fetch_receipts(
        rpc, peer, run_id, epoch, CERTIFIED, timeout_s, limit=count, start=first
    )
    leaves = [leaf for page in fetched.pages for leaf in page.leaves]
    if len(leaves) != count:
        raise ProtocolError(
            f"the data node served {len(leaves)} of this node's {count} leaves"
            + (f" ({fetched.stopped})" if fetched.stopped else "")
        )
    return checked_proofs(leaves, span, root)


def checked_proofs(leaves: list[LeafProof], span: WorkerRange, root: bytes) -> list[KeptProof]:
    """``leaves`` as kept proofs, if each is the next of the worker's leaves of ``span`` in the tree
    of ``root``; else a ``ProtocolError`` (nothing a data node serves is kept unchecked)."""
    kept = []
    for offset, leaf in enumerate(leaves):
        hop = leaf.hop
        if hop.index != span.first.hop.index + offset or hop.worker != span.first.hop.worker:
            raise ProtocolError(f"the data node served leaf {hop.index} of {hop.worker}")
        if not verify_proof(leaf.proof, root, hop.leaf()):
            raise ProtocolError(f"leaf {hop.index}'s proof does not check against the root")
        kept.append(
            KeptProof(hop.hopKey, hop.index, hop.unitsBefore, hop.signaturesHash, root, leaf.proof)
        )
    return kept
