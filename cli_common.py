"""What every ``sparsile`` subcommand shares: the exit statuses and the usage error (cli.py)."""

EXIT_OK, EXIT_DIAGNOSTICS, EXIT_USAGE, EXIT_UNAVAILABLE = 0, 1, 2, 3


class Usage(Exception):
    """A usage problem: printed as ``error: ...`` and exit status 2."""
