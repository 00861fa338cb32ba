"""hedgerow.controller.store: the SQL store: tables, engines and migrations, ingest, day partitions,
retention and rollups, the per-minute aggregates, the read queries and prices (I/O; no estimation).
"""
