"""``python -m node.cli``: the ``cx`` command, for child processes of the same interpreter."""

import sys

from node.cli import main

sys.exit(main())
