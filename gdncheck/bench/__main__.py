"""``python -m gdncheck.bench``."""

import sys

from . import main

sys.exit(main())
