"""``python -m pods.memory``: the memory report (``pods.memory.report``)."""

import sys

from pods.memory.report import main

sys.exit(main())
