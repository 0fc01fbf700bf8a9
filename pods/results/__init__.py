"""Results from run directories: the one reader of runs, one curve and speed-up stack, one plotting helper.

- ``runs``: ``Run`` / ``load_run`` (a run directory's config.json + metrics.jsonl), ``find_runs``, ``group`` and
  the curve labels (``LABELS``), a figure's ``runs.json`` list;
- ``curves``: mean curves over seeds on a grid (nothing extrapolated), bands, the paper's speed-up metric and
  its bootstrap interval;
- ``plot``: the figures (mean +- 1.96 SE bands);
- ``report``: CSV tables and the printed summaries (the CPU demo's, the paper figures');
- ``d3s``: the CPU D3S comparison's table and figures.

Used by ``pods.demo``, ``pods.figures`` and ``scripts/``; ``python -m pods.results.d3s`` draws the D3S comparison.
"""
