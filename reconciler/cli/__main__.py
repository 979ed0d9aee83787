"""``python -m reconciler.cli``: the ``argus`` command."""

import sys

from reconciler.cli import main

sys.exit(main())
