"""What every ``sparsile`` subcommand shares: the exit statuses and the usage error (cli.py)."""

EXIT_OK, EXIT_DIAGNOSTICS, EXIT_USAGE, EXIT_UNAVAILABLE = 0, 1, 2, 3


class Usage(Exception):
    """A usage problem: printed as ``error: ...`` (``error[SPxxxx]: ...`` and its help when it has a
    diagnostic code) and exit status 2."""

    def __init__(self, message: str, code: str | None = None, help: str | None = None):
        super().__init__(message)
        self.message, self.code, self.help = message, code, help

    def render(self) -> str:
        """The lines printed on stderr."""
        text = f"error[{self.code}]: {self.message}" if self.code else f"error: {self.message}"
        return text + (f"\n = help: {self.help}" if self.help else "")
