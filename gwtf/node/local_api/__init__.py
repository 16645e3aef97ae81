"""The node's local API at run time: its snapshot loop, chain watcher, disk watcher and server
(``service.py``), what they read (``snapshot``, ``watcher``, ``views``, ``earnings``, ``disk``), and
the client the command line talks to a running node with (``client.py``).

Nothing is imported here: ``gwtf-node status`` loads the client alone, without the server's
libraries.
"""
