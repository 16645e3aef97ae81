"""A node process logs at its settings' ``[log] level``, as text or JSON lines, and a level above
WARNING silences the networking libraries too (their records reach the root's handlers without
passing the root's level)."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from gwtf.node.logs import LibraryDigest, configure_logging
from gwtf.node.process import main


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    libraries = {name: logging.getLogger(name).level for name in ("libp2p", "multiaddr")}
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    for name, library_level in libraries.items():
        logging.getLogger(name).setLevel(library_level)


def emit_one_of_each() -> None:
    for name in ("gwtf.node.runtime.roles.relay", "libp2p.host.basic_host"):
        logger = logging.getLogger(name)
        logger.debug("debug from %s", name)
        logger.info("info from %s", name)
        logger.warning("warning from %s", name)
        logger.error("error from %s", name)


def test_the_level_given_is_the_level_logged(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("relay-1-0", "ERROR")
    emit_one_of_each()
    (line,) = capsys.readouterr().err.splitlines()
    assert (
        " relay-1-0 ERROR gwtf.node.runtime.roles.relay: error from gwtf.node.runtime.roles.relay"
        in line
    )
    # The library's warnings are not even made, and its errors are held: its digest would be a
    # WARNING line, which this level does not show, however long the node runs.
    assert not logging.getLogger("libp2p.host").isEnabledFor(logging.WARNING)
    (digest,) = logging.getLogger().handlers[0].filters
    assert isinstance(digest, LibraryDigest)
    digest.since -= 2 * digest.period_s
    logging.getLogger("libp2p.host").error("after a period")
    assert capsys.readouterr().err == ""


def test_debug_shows_the_libraries_and_info_summarises_them(
    capsys: pytest.CaptureFixture[str],
) -> None:
    configure_logging("data", "debug")
    emit_one_of_each()
    assert len(capsys.readouterr().err.splitlines()) == 8
    configure_logging("data", "INFO")  # again: the second configuration replaces the first
    emit_one_of_each()
    lines = capsys.readouterr().err.splitlines()
    # The node's own info and above; the library's warning and error (below CRITICAL) are
    # counted for the digest, which speaks once a period has passed.
    assert [line.split(": ", 1)[1] for line in lines] == [
        "info from gwtf.node.runtime.roles.relay",
        "warning from gwtf.node.runtime.roles.relay",
        "error from gwtf.node.runtime.roles.relay",
    ]


def test_json_lines_carry_the_fields(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("relay-2-0", "WARNING", json=True)
    try:
        raise OSError("disk full")
    except OSError:
        logging.getLogger("gwtf.node.store").exception("evidence not kept")
    logging.getLogger("gwtf.node.store").info("not shown")
    (line,) = capsys.readouterr().err.splitlines()
    record = json.loads(line)
    assert record["node"] == "relay-2-0" and record["level"] == "ERROR"
    assert record["logger"] == "gwtf.node.store" and record["message"] == "evidence not kept"
    assert "OSError: disk full" in record["exception"]
    assert record["time"].endswith("Z")


def test_an_unknown_level_is_refused() -> None:
    with pytest.raises(ValueError, match="VERBOSE"):
        configure_logging("relay", "VERBOSE")


def test_a_node_process_takes_its_level_from_its_settings_file(tmp_path: Path) -> None:
    config = tmp_path / "relay-1-0.toml"
    # It stops early (no key), after its logging is configured from the file.
    config.write_text('[log]\nlevel = "ERROR"\njson = true\n[node]\nkey_file = "/none/key.json"\n')
    threads = torch.get_num_threads()
    try:
        assert main(["--config", str(config), "--status-file", str(tmp_path / "s.json")]) != 0
    finally:
        torch.set_num_threads(threads)
    root = logging.getLogger()
    assert root.level == logging.ERROR
    assert logging.getLogger("libp2p").level == logging.ERROR
    (handler,) = root.handlers
    assert type(handler.formatter).__name__ == "JsonLines"
