"""Which window of a data set a row of a microbatch reads: a keyed, stateless permutation.

Row ``r`` of the run (microbatch ``m``, row ``j``: ``r = m * batch_size + j``) falls in epoch
``r // W`` at index ``r % W`` of the ``W`` windows; the index is permuted by a 4-round Feistel
network over the smallest even number of bits that covers ``W``, walking the cycle until the value
falls below ``W`` (at most ~4 steps on average). The round keys come from
``sha256(data set hash, run seed, epoch)``, so each epoch visits every window exactly once in its
own order, any node computes any row from those numbers alone, and there is nothing to checkpoint
or to hand over when data nodes come and go.

Only SHA-256 and BLAKE2b are used: never numpy's generators (their streams are promised on one
build only) nor Python's ``hash()`` (salted per process).
"""

from __future__ import annotations

import hashlib

ROUNDS = 4


def epoch_key(dataset_digest: str, seed: int, epoch: int) -> bytes:
    material = f"gwtf-windows/{dataset_digest}/{seed}/{epoch}".encode()
    return hashlib.sha256(material).digest()


def permute(index: int, count: int, key: bytes) -> int:
    """``index`` in 0..count-1 mapped through the permutation of ``range(count)`` that ``key``
    names."""
    if not 0 <= index < count:
        raise ValueError(f"index {index} outside 0..{count - 1}")
    if count == 1:
        return 0
    half = max(1, ((count - 1).bit_length() + 1) // 2)
    value = index
    while True:  # cycle-walking: a permutation of 2**(2*half) restricted to range(count)
        value = _feistel(value, half, key)
        if value < count:
            return value


def _feistel(value: int, half: int, key: bytes) -> int:
    mask = (1 << half) - 1
    left, right = value >> half, value & mask
    for round_number in range(ROUNDS):
        data = key + bytes((round_number,)) + right.to_bytes(8, "big")
        mixed = int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big") & mask
        left, right = right, left ^ mixed
    return (left << half) | right


def window_of_row(row: int, count: int, dataset_digest: str, seed: int) -> tuple[int, int]:
    """(epoch, window index) of the run's row ``row`` over ``count`` windows."""
    epoch, index = divmod(row, count)
    return epoch, permute(index, count, epoch_key(dataset_digest, seed, epoch))
