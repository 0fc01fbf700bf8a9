"""``python -m pods.eval``: the same as ``pods-eval`` (``pods.eval.cli``)."""

import sys

from pods.eval.cli import main

sys.exit(main())
