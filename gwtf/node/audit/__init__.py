"""Auditing an epoch: the checks of certificates and receipts against the chain's rules, and
the fraud proofs of what they find (``checks``)."""
