"""``python -m node.cli``: the same as the ``gwtf-node`` console script."""

import sys

from node.cli.main import main

sys.exit(main())
