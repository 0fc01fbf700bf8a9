"""Curves from finished runs: eval accuracy against TRAINING wall-clock, read from each run's metrics.jsonl."""

from __future__ import annotations

import csv
from pathlib import Path

from pods.metrics import read_metrics

FIELDS = ["label", "run_dir", "step", "train_time", "accuracy", "format_accuracy", "reward", "mean_length"]


def eval_rows(runs: dict[str, list[str | Path]]) -> list[dict]:
    """One row per eval of every run; ``runs`` maps a curve label to its run directories (seeds)."""
    out = []
    for label, dirs in runs.items():
        for d in dirs:
            for r in read_metrics(Path(d) / "metrics.jsonl", kind="eval"):
                out.append({"label": label, "run_dir": str(d), **{k: r.get(k) for k in FIELDS[2:]}})
    return out


def write_csv(rows: list[dict], path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        w.writerows(rows)
    return path


def plot_accuracy_vs_time(rows: list[dict], path: str | Path, title: str = "") -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    labels = list(dict.fromkeys(r["label"] for r in rows))
    for i, label in enumerate(labels):
        color = f"C{i}"
        for j, run in enumerate(dict.fromkeys(r["run_dir"] for r in rows if r["label"] == label)):
            pts = sorted((r["train_time"], r["accuracy"]) for r in rows if r["run_dir"] == run and r["label"] == label)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=3, color=color, label=label if j == 0 else None)
    ax.set_xlabel("training wall-clock (s, evaluation excluded)")
    ax.set_ylabel("test accuracy")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
