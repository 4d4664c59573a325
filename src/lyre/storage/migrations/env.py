"""Alembic's environment for Lyre's database: migrations run on the connection that
:func:`lyre.storage.db.migrate` hands over (no alembic.ini, no URL in a file)."""

from alembic import context

from lyre.storage.db import metadata

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=metadata,
                  render_as_batch=connection.dialect.name == "sqlite")  # SQLite alters tables by copying them
with context.begin_transaction():
    context.run_migrations()
