"""Alembic revisions of the hedgerow store, oldest first (``0001`` creates every table)."""
