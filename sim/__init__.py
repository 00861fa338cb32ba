"""Package placeholder; filled in by its module."""
