"""``python -m sparsile``: the ``sparsile`` command line (:func:`sparsile.cli.main`)."""

import sys

from .cli import main

sys.exit(main())
