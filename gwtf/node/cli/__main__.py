"""``python -m gwtf.node.cli``: the same as the ``gwtf-node`` console script."""

import sys

from gwtf.node.cli.main import main

sys.exit(main())
