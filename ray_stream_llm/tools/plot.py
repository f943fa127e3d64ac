"""``ray-stream-llm bench --plot FILE.png``: where the seconds of a cold start go, per path.

One horizontal bar per path (and engine count), the medians over the runs, in the
order a job spends them: building the processor (the driver's preflight and metadata
fetch included), the engine actor's metadata fetch, the weight phase (the slowest
engine's streamer, first request to last tensor; for Ray's download path inside
"engine start"), the rest of the engine start (vLLM initialisation), and the time from
the slowest engine ready to the first output row (scheduling, the first batch).
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

SEGMENTS = (
    ("build", "#4c72b0"),
    ("metadata", "#55a868"),
    ("weights", "#c44e52"),
    ("engine start", "#8172b2"),
    ("to first row", "#ccb974"),
)


def _median(values: list[float]) -> float:
    finite = [v for v in values if v is not None and not math.isnan(v)]
    return statistics.median(finite) if finite else 0.0


def _bars(runs: list[dict[str, Any]]) -> dict[str, list[float]]:
    """label -> seconds per segment."""
    rows: dict[str, list[list[float]]] = {}
    for run in runs:
        for key, r in run.get("sharing", {}).items():
            path, n = key.rsplit(".", 1)
            ready, weights = r["slowest_ready_seconds"], r["slowest_weight_seconds"]
            rows.setdefault(f"{path}, {n} engine{'s' if n != '1' else ''}", []).append(
                [
                    r["build_seconds"],
                    r["metadata_seconds"],
                    weights,
                    ready,
                    r["first_row_seconds"] - r["build_seconds"] - ready,
                ]
            )
        for variant, r in run.get("cold_start", {}).items():
            rows.setdefault(f"{variant}, 1 engine", []).append(
                [
                    r["build_seconds"],
                    r["metadata_seconds"],
                    r["weight_seconds"],
                    r["engine_ready_seconds"],
                    r["first_row_seconds"] - r["build_seconds"] - r["engine_ready_seconds"],
                ]
            )
    bars = {}
    for label, samples in rows.items():
        build, meta, weights, ready, tail = (
            _median(list(col)) for col in zip(*samples, strict=True)
        )
        bars[label] = [build, meta, weights, max(ready - meta - weights, 0.0), max(tail, 0.0)]
    return bars


def plot(runs: list[dict[str, Any]], path: str | Path, title: str = "") -> Path:
    """Draw the bars of ``runs`` (BenchResult.runs) into the PNG ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bars = _bars(runs)
    if not bars:
        raise ValueError("no cold-start or node-sharing results to plot")
    labels = list(bars)
    fig, ax = plt.subplots(figsize=(10, 0.6 * len(labels) + 1.6))
    left = [0.0] * len(labels)
    for k, (name, color) in enumerate(SEGMENTS):
        widths = [bars[label][k] for label in labels]
        ax.barh(labels, widths, left=left, color=color, label=name)
        left = [a + b for a, b in zip(left, widths, strict=True)]
    for y, total in enumerate(left):
        ax.text(total + 0.5, y, f"{total:.0f} s", va="center", fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("seconds from the job's start to its first output row (median)")
    ax.set_title(title or "Where the seconds of a cold start go")
    ax.legend(loc="lower right", fontsize=8, ncol=len(SEGMENTS))
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
