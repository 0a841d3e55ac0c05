"""``python -m mmlake.flows.cli``: the ``mmlake`` command."""

import sys

from mmlake.flows.cli import main

sys.exit(main())
