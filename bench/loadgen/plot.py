"""The throughput/latency frontier as a PNG: output tokens/s against p99 TTFT and against p99 TPOT, one line
per series (e.g. one configuration swept over concurrency), each point labelled."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.loadgen.metrics import Summary

LOG_SPAN = 30.0
Series = Sequence[tuple[str, Summary]]  # (point label, its summary)


def pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend (no display needed); an ImportError names the extra to install."""
    try:
        import matplotlib  # noqa: PLC0415  (optional dependency, imported only to plot)
    except ImportError as exc:
        raise ImportError("plots need matplotlib: pip install 'pagedserve[bench]'") from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    return plt


def plot_frontier(series: Mapping[str, Series], path: str | Path, title: str, percentile: int = 99) -> Path:
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.4), constrained_layout=True)
    for ax, metric, name in ((axes[0], "ttft_ms", "TTFT"), (axes[1], "tpot_ms", "TPOT")):
        xs = [x for label, points in series.items() for x in _draw(ax, label, points, metric, percentile)]
        ax.set_xlabel(f"p{percentile} {name} (ms)")
        ax.set_ylabel("output throughput (tokens/s)")
        ax.grid(True, alpha=0.3)
        _scale(ax, xs)
    axes[0].legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def _draw(ax: Any, label: str, points: Series, metric: str, percentile: int) -> list[float]:
    xs = [getattr(s, metric).percentile(percentile) for _, s in points]
    ys = [s.output_throughput for _, s in points]
    ax.plot(xs, ys, marker="o", label=label)
    for (name, _), x, y in zip(points, xs, ys, strict=True):
        ax.annotate(name, (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
    return xs


def _scale(ax: Any, xs: list[float]) -> None:
    """A log axis when the latencies span more than a decade and a half, labelled with plain numbers."""
    finite = [x for x in xs if math.isfinite(x) and x > 0]
    if finite and max(finite) / min(finite) > LOG_SPAN:
        from matplotlib.ticker import FuncFormatter, NullFormatter  # noqa: PLC0415

        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.xaxis.set_minor_formatter(NullFormatter())
