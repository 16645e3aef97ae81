"""Opening the node database: the engine for its URL, the schema migrated to the newest revision.

SQLite (the default, one file per node) runs in WAL mode with ``synchronous=NORMAL``: a commit is
durable once it returns against a killed process (the log is in the OS's hands), readers never
block the writer, and a commit costs tens of microseconds instead of an fsync. PostgreSQL is used
as given by its URL (``postgresql+psycopg://…``). Either way the schema is Alembic's: ``open``
upgrades the database to the newest migration before anything reads it, so a node of a newer
build picks up an older database by itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, create_engine, event, make_url
from sqlalchemy.exc import ArgumentError, OperationalError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from gwtf.errors import ConfigError, GwtfError

MIGRATIONS = Path(__file__).resolve().parents[2] / "migrations"


class DatabaseError(GwtfError):
    """The node database could not be opened or written."""

    exit_code = 1


@dataclass(frozen=True)
class Database:
    """An open node database: its engine and a factory of sessions."""

    engine: Engine
    sessions: sessionmaker[Session]

    def close(self) -> None:
        self.engine.dispose()


def alembic_config(url: str, connection: Any = None) -> Config:
    """Alembic's configuration for the node database at ``url`` (no alembic.ini needed)."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    if connection is not None:
        config.attributes["connection"] = connection
    return config


def shown_url(url: str) -> str:
    """``url`` with any password masked, for messages and logs."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except (ArgumentError, ValueError):
        # Not parsable, so where a password ends is unknown: everything after the scheme goes.
        scheme, sep, _ = url.partition("://")
        return f"{scheme}://***" if sep else "***"


def create_store_engine(url: str) -> Engine:
    """The engine for ``url``; SQLite files get WAL, synchronous=NORMAL and foreign keys."""
    try:
        engine = create_engine(url, future=True)
    except (ArgumentError, ImportError, ValueError) as exc:
        raise ConfigError(
            f"db.url={shown_url(url)!r} is not a database URL this node can open ({exc}); use "
            "sqlite:///path/node.sqlite or postgresql+psycopg://user@host/db"
        ) from exc
    if engine.dialect.name == "sqlite":
        database = engine.url.database
        if database and database != ":memory:":
            Path(database).parent.mkdir(parents=True, exist_ok=True)

        @event.listens_for(engine, "connect")
        def _pragmas(connection: Any, _record: Any) -> None:
            cursor = connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.execute("PRAGMA busy_timeout=5000")
            cursor.close()

    return engine


def open_database(url: str, *, migrate: bool = True) -> Database:
    """Open (creating it if needed) and migrate the node database at ``url``. A reader
    (``migrate=False``: ``gwtf-node earnings``, ``receipts``) changes nothing: a database its
    node has not migrated to this version is a ``DatabaseError`` saying so."""
    engine = create_store_engine(url)
    try:
        with engine.begin() as connection:
            if migrate:
                command.upgrade(alembic_config(url, connection), "head")
            else:
                _check_current(connection, url)
    except OperationalError as exc:
        engine.dispose()
        raise DatabaseError(
            f"cannot open the node database at {shown_url(url)} ({exc.orig}); check db.url "
            "and that the server is running"
        ) from exc
    except SQLAlchemyError as exc:
        engine.dispose()
        raise DatabaseError(f"migrating the node database failed: {exc}") from exc
    except DatabaseError:
        engine.dispose()
        raise
    return Database(engine, sessionmaker(engine, expire_on_commit=False))


def _check_current(connection: Any, url: str) -> None:
    head = ScriptDirectory.from_config(alembic_config(url)).get_current_head()
    current = MigrationContext.configure(connection).get_current_revision()
    if current != head:
        raise DatabaseError(
            f"the node database at {shown_url(url)} is at schema {current or 'none'}, this "
            f"gwtf-node reads {head}: start the node once (it migrates its database)"
        )
