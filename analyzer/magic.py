"""What a file's bytes say before anything heavy is imported, declared once: the first bytes of a
SQLite database and of gzip, and the words and levels of a server log's lines. Read by the
sources that open a file and by the light modules that look at one before polars is imported
(the command sizing polars for its inputs, the local workers telling a fleet of databases)."""

SQLITE_MAGIC = b"SQLite format 3\x00"  # a SQLite database file's first 16 bytes
GZIP_MAGIC = b"\x1f\x8b"  # a gzip member's first two bytes (RFC 1952)

# The levels python logging names (reference 9.2): a standard record opens with one of them.
LEVEL_NAMES = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
# rich writes the level in a column of 8 characters: each name padded to that width (9.2).
RICH_LEVEL_COLUMNS = tuple(name.ljust(8) for name in LEVEL_NAMES)

# What can make a one-line record more to the audit than its level and time (by
# ``EventCollector.add``'s rules): an event or run/job line, a line of a dstack logger (known,
# or counted as unrecognised), a version marker in its text or logger, the admin token (a secret
# to redact). Every line any of messages.MATTER_TEXT_PATTERNS and MATTER_LOGGER_PATTERNS
# matches (the text ones on the stripped message, the logger ones on the logger) holds one of
# MATTER_WORDS (tests/test_log_reader.py generates lines of every pattern): a line that holds
# none of them is irrelevant, provably, and is counted without being classified or folded
# (``LogStream``'s prefilter). The others take the full path. (Words of four characters or
# more: a search for a shorter one is several times slower.)
MATTER_WORDS: tuple[str, ...] = (
    "Emitting",
    "run(",
    "job(",
    "The dstack server",
    "The admin token is",
    "run status has changed",
    "now is ",
    "job status is ",
    "updated",  # Run updated
    "created",  # Job created
    "Service",
    "dstack",
    ".background.",
)
