"""Shared leaf of the GWTF project: the error root every layer raises from. Imports nothing."""
