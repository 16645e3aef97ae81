"""An embedded eth-tester (py-evm) chain served over HTTP JSON-RPC on 127.0.0.1.

It is what `gwtf-node devnet` serves where anvil is not installed, and how tests share an
in-process chain they built with other processes (nodes, the CLI, an auditor). Requests go
through web3's own eth-tester request/result formatters, so the chain behaves exactly as
``EthereumTesterProvider`` does in process; results are re-encoded as standard JSON-RPC
quantities (hex) so any Ethereum client can talk to it (not every shape matches a real node's:
full transactions inside blocks keep eth-tester's snake_case keys, ``eth_getLogs`` by
``blockHash`` is not served and from ``"earliest"`` finds nothing).

A revert is answered like geth and anvil do (``code 3``, ``data`` = the raw revert bytes), so
web3's ``HTTPProvider`` raises ``ContractLogicError``/``ContractCustomError`` with the data that
``gwtf.contracts.bindings.decode_revert`` turns into the contract's custom error.

Also served, as anvil/hardhat name them: ``evm_increaseTime`` (seconds; mines a block at the new
time), ``evm_mine``, ``evm_snapshot`` and ``evm_revert``; and ``net_version`` is the chain id.
"""

from __future__ import annotations

import ast
import json
import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from eth_tester import EthereumTester
from eth_tester.exceptions import TransactionFailed
from eth_tester.exceptions import ValidationError as TesterValidationError
from eth_utils.exceptions import ValidationError as EvmValidationError
from eth_utils.hexadecimal import encode_hex
from web3.exceptions import ContractLogicError
from web3.providers.eth_tester.defaults import API_ENDPOINTS
from web3.providers.eth_tester.middleware import request_formatters, result_formatters
from web3.types import RPCEndpoint

logger = logging.getLogger(__name__)

# Contract deployments are ~50 KB of hex; 8 MiB leaves room for big batches and bounds memory.
MAX_REQUEST_BYTES = 8 * 1024 * 1024
MAX_BATCH_REQUESTS = 256

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
SERVER_ERROR = -32000
EXECUTION_REVERTED = 3

_TX_METHODS_NEEDING_FROM = ("eth_call", "eth_estimateGas", "eth_sendTransaction")


class RpcFailure(Exception):
    """A JSON-RPC error object to send back (not a GwtfError: it never reaches a person)."""

    def __init__(self, code: int, message: str, data: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data

    def to_json(self) -> dict[str, Any]:
        error: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.data is not None:
            error["data"] = self.data
        return error


def to_json_rpc(value: Any) -> Any:
    """Encode eth-tester's Python values as JSON-RPC: ints as hex quantities, bytes as hex data."""
    if value is None or isinstance(value, bool | str | float):
        return value
    if isinstance(value, int):
        return hex(value)
    if isinstance(value, bytes | bytearray):
        return encode_hex(bytes(value))
    if isinstance(value, dict):
        return {str(k): to_json_rpc(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_json_rpc(v) for v in value]
    raise TypeError(f"cannot encode {type(value).__name__} as JSON-RPC")


def revert_data(exc: TransactionFailed) -> str | None:
    """The raw revert bytes eth-tester carries, as 0x-hex (it stores them as a bytes literal)."""
    arg: Any = exc.args[0] if exc.args else None
    if isinstance(arg, Exception) and arg.args:
        arg = arg.args[0]
    if isinstance(arg, bytes):
        return encode_hex(arg)
    if isinstance(arg, str) and arg[:2] in ("b'", 'b"'):
        try:
            parsed = ast.literal_eval(arg)
        except (ValueError, SyntaxError):
            return None
        if isinstance(parsed, bytes):
            return encode_hex(parsed)
    return None


class EthTesterRpc:
    """Dispatches JSON-RPC requests to one ``EthereumTester``, one request at a time."""

    def __init__(self, tester: EthereumTester | None = None) -> None:
        self.tester = tester if tester is not None else EthereumTester()
        # py-evm is not thread-safe; the HTTP server is threaded, so requests are serialised.
        self._lock = threading.Lock()
        self._extra: dict[str, Callable[[list[Any]], Any]] = {
            "evm_increaseTime": self._increase_time,
            "evm_mine": self._mine,
            "net_version": self._network_id,
        }

    def handle(self, payload: Any) -> Any:
        """Answer a decoded JSON-RPC payload (one request or a batch); None for notifications."""
        if isinstance(payload, list):
            if not payload or len(payload) > MAX_BATCH_REQUESTS:
                return _error_response(None, RpcFailure(INVALID_REQUEST, "bad batch size"))
            answers = [self._handle_one(item) for item in payload]
            return [a for a in answers if a is not None]
        return self._handle_one(payload)

    def _handle_one(self, request: Any) -> dict[str, Any] | None:
        if not isinstance(request, dict) or not isinstance(request.get("method"), str):
            return _error_response(None, RpcFailure(INVALID_REQUEST, "invalid request"))
        request_id = request.get("id")
        params = request.get("params", [])
        if not isinstance(params, list):
            return _error_response(request_id, RpcFailure(INVALID_PARAMS, "params must be a list"))
        try:
            with self._lock:
                result = self.call(request["method"], params)
        except RpcFailure as failure:
            return _error_response(request_id, failure)
        except Exception as exc:  # supervision boundary: one bad request must not kill the chain
            logger.exception("devnet RPC %s failed", request["method"])
            return _error_response(request_id, RpcFailure(SERVER_ERROR, f"internal error: {exc}"))
        if "id" not in request:
            return None
        return {"jsonrpc": "2.0", "id": request_id, "result": result}

    def call(self, method: str, params: list[Any]) -> Any:
        """Run one method and return its JSON-RPC-encoded result, or raise ``RpcFailure``."""
        if method in self._extra:
            return to_json_rpc(self._extra[method](params))
        namespace, _, endpoint = method.partition("_")
        delegator = API_ENDPOINTS.get(namespace, {}).get(endpoint)
        if delegator is None:
            raise RpcFailure(METHOD_NOT_FOUND, f"method {method} is not served by this devnet")
        params = self._fill_defaults(method, params)
        formatter = request_formatters.get(RPCEndpoint(method))
        try:
            formatted = formatter(params) if formatter else params
            raw = delegator(self.tester, formatted)
        except TransactionFailed as exc:
            data = revert_data(exc)
            message = "execution reverted" if data is not None else f"execution reverted: {exc}"
            raise RpcFailure(EXECUTION_REVERTED, message, data) from exc
        except ContractLogicError as exc:  # panics, raised by web3's eth-tester glue
            raise RpcFailure(
                EXECUTION_REVERTED, "execution reverted", _str_or_none(exc.data)
            ) from exc
        except NotImplementedError as exc:
            raise RpcFailure(METHOD_NOT_FOUND, f"method {method} is not implemented") from exc
        except (EvmValidationError, TesterValidationError) as exc:
            # py-evm says "cannot afford txn gas"; clients look for geth's wording.
            text = str(exc)
            if "cannot afford" in text:
                text = f"insufficient funds for gas * price + value: {text}"
            raise RpcFailure(SERVER_ERROR, text) from exc
        except (ValueError, TypeError, KeyError, IndexError) as exc:
            raise RpcFailure(INVALID_PARAMS, f"invalid params for {method}: {exc}") from exc
        result_formatter = result_formatters.get(RPCEndpoint(method)) if result_formatters else None
        result = result_formatter(raw) if result_formatter else raw
        return to_json_rpc(result)

    def _fill_defaults(self, method: str, params: list[Any]) -> list[Any]:
        if method not in _TX_METHODS_NEEDING_FROM or not params or not isinstance(params[0], dict):
            return params
        tx = dict(params[0])
        # Clients send the calldata as "input" (newer) or "data" (older); eth-tester wants "data".
        if "input" in tx and "data" not in tx:
            tx["data"] = tx.pop("input")
        else:
            tx.pop("input", None)
        if not tx.get("from"):
            tx["from"] = self.tester.get_accounts()[0]
        # Fields eth-tester does not know about would fail its validation.
        for unknown in ("type",):
            tx.pop(unknown, None)
        return [tx, *params[1:]]

    def _increase_time(self, params: list[Any]) -> int:
        seconds = _quantity(params[0] if params else None, "evm_increaseTime seconds")
        latest = self.tester.get_block_by_number("latest")["timestamp"]
        self.tester.time_travel(latest + seconds)
        return seconds

    def _mine(self, params: list[Any]) -> str:
        self.tester.mine_blocks(1)
        return "0x0"

    def _network_id(self, params: list[Any]) -> str:
        # Wallets read the network from net_version: web3's eth-tester glue says "1" (mainnet).
        chain_id = API_ENDPOINTS["eth"]["chainId"](self.tester, [])
        return str(int(chain_id))


def _quantity(value: Any, what: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    if isinstance(value, str):
        try:
            number = int(value, 0)
        except ValueError:
            number = -1
        if number >= 0:
            return number
    raise RpcFailure(INVALID_PARAMS, f"{what} must be a non-negative quantity")


def _str_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _error_response(request_id: Any, failure: RpcFailure) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "error": failure.to_json()}


class _Handler(BaseHTTPRequestHandler):
    server: DevnetHttpServer

    def do_POST(self) -> None:
        length_header = self.headers.get("Content-Length", "")
        if not length_header.isdigit() or int(length_header) > MAX_REQUEST_BYTES:
            self._send(413, _error_response(None, RpcFailure(INVALID_REQUEST, "bad body length")))
            return
        body = self.rfile.read(int(length_header))
        try:
            payload = json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError):
            self._send(200, _error_response(None, RpcFailure(PARSE_ERROR, "parse error")))
            return
        self._send(200, self.server.rpc.handle(payload))

    def _send(self, status: int, answer: Any) -> None:
        body = json.dumps(answer).encode() if answer is not None else b""
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        # One line per RPC call would drown the devnet's own output.
        return


class DevnetHttpServer(ThreadingHTTPServer):
    """HTTP JSON-RPC server for an ``EthTesterRpc``; ``port=0`` picks a free port."""

    daemon_threads = True

    def __init__(self, rpc: EthTesterRpc, host: str = "127.0.0.1", port: int = 0) -> None:
        super().__init__((host, port), _Handler)
        self.rpc = rpc
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host!s}:{port}"

    def start_background(self) -> DevnetHttpServer:
        """Serve from a daemon thread (for tests and in-process use); stop with ``stop()``."""
        self._thread = threading.Thread(target=self.serve_forever, name="devnet-rpc", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.shutdown()
        self.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
