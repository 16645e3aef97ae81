"""A TCP probe run inside a test bed's namespaces: a server that tells each client the address
it saw, and a client that says what happened to its dial.

    python -m tests.internet.probe serve PORT
    python -m tests.internet.probe dial IP PORT [--source-port P] [--timeout S]

``serve`` prints ``listening`` once bound; ``dial`` prints one line: ``seen IP PORT`` (the
address the server saw: a home's router's mapping), ``refused`` (a reset), ``timeout`` or
``unreachable`` (no route).
"""

from __future__ import annotations

import argparse
import socket


def serve(port: int) -> None:
    with socket.create_server(("0.0.0.0", port)) as server:
        print("listening", flush=True)
        while True:
            conn, (ip, peer_port) = server.accept()
            with conn:
                conn.sendall(f"{ip} {peer_port}\n".encode())


def dial(ip: str, port: int, source_port: int, timeout_s: float) -> str:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if source_port:
            sock.bind(("0.0.0.0", source_port))
        sock.settimeout(timeout_s)
        try:
            sock.connect((ip, port))
            return f"seen {sock.makefile().readline().strip()}"
        except ConnectionRefusedError:
            return "refused"
        except TimeoutError:
            return "timeout"
        except OSError:  # no route to the address
            return "unreachable"


def main() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command", required=True)
    serving = sub.add_parser("serve")
    serving.add_argument("port", type=int)
    dialing = sub.add_parser("dial")
    dialing.add_argument("ip")
    dialing.add_argument("port", type=int)
    dialing.add_argument("--source-port", type=int, default=0)
    dialing.add_argument("--timeout", type=float, default=2.0)
    args = parser.parse_args()
    if args.command == "serve":
        serve(args.port)
    else:
        print(dial(args.ip, args.port, args.source_port, args.timeout), flush=True)


if __name__ == "__main__":
    main()
