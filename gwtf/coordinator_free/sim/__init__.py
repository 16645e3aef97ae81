"""Discrete-event simulator of decentralised pipeline training, and the ``gwtf-sim`` command.

``policy`` is the contract a routing algorithm implements, ``scenario`` the JSON input,
``engine`` the event loop (built in layers: ``engine_base``, ``hops``, ``recovery``,
``membership``, ``iterations``), ``metrics`` what a run reports, ``generator`` the paper-like grid.
"""
