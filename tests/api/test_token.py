"""The API's bearer token: made once, private to its owner, read back by every later start; a
file that cannot hold one is a one-line error."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from gwtf.errors import ConfigError
from gwtf.node.local_api.server import api_token


def test_the_token_is_made_once_private_and_read_back(tmp_path: Path) -> None:
    path = tmp_path / "node" / "api-token"
    token = api_token(path)
    assert len(token) >= 32 and api_token(path) == token
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert os.listdir(path.parent) == ["api-token"]  # no draft left beside it


def test_a_file_without_a_token_says_to_delete_it(tmp_path: Path) -> None:
    path = tmp_path / "api-token"
    path.write_text("short\n")
    with pytest.raises(ConfigError, match="delete it"):
        api_token(path)


def test_a_path_that_cannot_hold_a_file_is_one_line_error(tmp_path: Path) -> None:
    (tmp_path / "api-token").mkdir()
    with pytest.raises(ConfigError, match=r"cannot be read or made .* api\.token_file"):
        api_token(tmp_path / "api-token")
