"""``python -m gateway.cli``: the ``hexflow`` command line."""

import sys

from gateway.cli import main

sys.exit(main())
