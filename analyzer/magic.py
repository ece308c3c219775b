"""The first bytes that say what a file is, declared once: read by the sources that open a file
and by the light modules that look at one before anything heavy is imported (the command sizing
polars for its inputs, the local workers telling a fleet of databases)."""

SQLITE_MAGIC = b"SQLite format 3\x00"  # a SQLite database file's first 16 bytes
GZIP_MAGIC = b"\x1f\x8b"  # a gzip member's first two bytes (RFC 1952)
