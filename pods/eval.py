"""``python -m pods.eval``: the same as ``pods-eval`` (pods.evals.cli)."""

import sys

from pods.evals.cli import main

if __name__ == "__main__":
    sys.exit(main())
