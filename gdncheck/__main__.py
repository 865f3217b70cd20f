"""``python -m gdncheck``: the ``gdncheck`` command line (:mod:`gdncheck.cli`)."""

import sys

from .cli import main

sys.exit(main())
