"""The error root: every family has its own documented exit code and keeps its message."""

from __future__ import annotations

from gwtf import errors


def test_every_error_family_has_a_distinct_exit_code() -> None:
    families = [
        cls
        for cls in vars(errors).values()
        if isinstance(cls, type)
        and issubclass(cls, errors.GwtfError)
        and cls is not errors.GwtfError
    ]
    codes = [cls.exit_code for cls in families]
    assert len(families) >= 6
    assert len(set(codes)) == len(codes)
    assert errors.GwtfError.exit_code not in codes


def test_error_keeps_the_message_and_the_cause() -> None:
    cause = ConnectionRefusedError("refused")
    try:
        try:
            raise cause
        except ConnectionRefusedError as exc:
            raise errors.ChainError("cannot reach chain RPC at http://127.0.0.1:1") from exc
    except errors.GwtfError as err:
        assert str(err) == "cannot reach chain RPC at http://127.0.0.1:1"
        assert err.__cause__ is cause
        assert err.exit_code == 3
