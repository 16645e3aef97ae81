"""Alembic's environment for the node database: the URL and connection come from
``gwtf.node.store.database`` (which runs the migrations at start), never from a file."""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection, engine_from_config, pool

from gwtf.node.store.models import Base

config = context.config
target_metadata = Base.metadata


def run_migrations_offline() -> None:
    """Emit SQL for the URL without a connection (``alembic upgrade --sql``)."""
    context.configure(
        url=config.get_main_option("sqlalchemy.url"),
        target_metadata=target_metadata,
        literal_binds=True,
        render_as_batch=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run(connection: Connection) -> None:
    # Batch mode: SQLite alters a table by copying it, which later migrations will need.
    context.configure(connection=connection, target_metadata=target_metadata, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        run(connection)
        return
    engine = engine_from_config(
        config.get_section(config.config_ini_section, {}),
        prefix="sqlalchemy.",
        poolclass=pool.NullPool,
    )
    with engine.connect() as fresh:
        run(fresh)


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
