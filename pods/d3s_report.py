"""``python -m pods.d3s_report --runs DIR --out DIR``: the CPU D3S comparison's figures and summary.csv
(``pods.results.d3s``)."""

from pods.results.d3s import main

if __name__ == "__main__":
    main()
