"""The node's own database: receipts it signed and countersigned, the hops it certified, its
epochs, claims and rewards, slashes and challenges it saw, and its peers (SQLAlchemy 2 over
SQLite by default, PostgreSQL by URL; the schema is the Alembic migrations in
``gwtf/migrations/``)."""
