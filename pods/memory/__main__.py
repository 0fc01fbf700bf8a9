"""``python -m pods.memory``: the memory report (``pods.memory.report``)."""

from pods.memory.report import main

main()
