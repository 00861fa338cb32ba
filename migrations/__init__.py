"""hedgerow.migrations: the Alembic environment and revisions of the store, shipped in the wheel.

``hedgerow db upgrade`` (``hedgerow.controller.store.db.upgrade_database``) points Alembic at this
package's folder, so migrations run the same from a checkout and from an installed wheel.
"""
