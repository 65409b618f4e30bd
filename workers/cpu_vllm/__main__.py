"""``python -m workers.cpu_vllm``: see ``workers.cpu_vllm.cli``."""

import sys

from workers.cpu_vllm.cli import main

sys.exit(main())
