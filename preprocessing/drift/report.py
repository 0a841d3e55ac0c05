"""What a drift run shows people: a markdown table and a PNG plot of each metric against event time,
thresholds drawn, alarms marked."""

from __future__ import annotations

import base64
import io
from datetime import UTC, datetime
from typing import Any

from ingest.engine import format_us
from preprocessing.drift.run import DriftSummary


def plot_png(rows: list[dict[str, Any]], title: str) -> bytes:
    """One panel per metric: value over window end, threshold(s) dashed, alarmed windows in red."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = sorted({r["metric"] for r in rows})
    cols = 3
    nrows = max(1, (len(metrics) + cols - 1) // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(4.2 * cols, 2.4 * nrows), squeeze=False)
    for ax, metric in zip(axes.ravel(), metrics, strict=False):
        mine = [r for r in rows if r["metric"] == metric and r["value"] is not None]
        t = [datetime.fromtimestamp(r["window_end"] / 1e6, UTC) for r in mine]
        ax.plot(t, [r["value"] for r in mine], lw=1, color="tab:blue")
        sides = {"entropy": ("threshold_low", "threshold_high"), "mi": ("threshold_low",)}
        for key in sides.get(metric.split(".")[0], ("threshold_high",)):  # only the side(s) that alarm
            ax.plot(t, [r[key] for r in mine], lw=0.8, ls="--", color="grey")
        alarm = [(ti, r["value"]) for ti, r in zip(t, mine, strict=True) if r["alarm"]]
        if alarm:
            ax.scatter(*zip(*alarm, strict=True), s=8, color="red", zorder=3, label="alarm")
        ax.set_title(metric, fontsize=9)
        ax.tick_params(labelsize=7)
        ax.tick_params(axis="x", rotation=30)
    for ax in axes.ravel()[len(metrics):]:
        ax.set_visible(False)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80)
    plt.close(fig)
    return buf.getvalue()


def markdown(summary: DriftSummary, png: bytes | None, trained: bool | None) -> str:
    lines = [f"### Drift of `{summary.stream}`", "", summary.line(), ""]
    if trained is False:
        lines += ["**The embeddings come from UNTRAINED (seeded) encoders**: the codes reflect low-level "
                  "statistics, not meaning.", ""]
    lines += ["| | |", "|---|---|", f"| samples scored | {summary.samples} |", f"| windows | {summary.windows} |",
              f"| codebook | `{(summary.codebook_sha256 or '')[:16]}` |",
              f"| metric-windows skipped (too few valid parts) | {summary.skipped_metrics} |"]
    for m, counts in sorted(summary.invalid.items()):
        bad = ", ".join(f"{n} {k}" for k, n in counts.items() if n)
        lines.append(f"| {m} parts not used | {bad or 'none'} |")
    for m, why in sorted(summary.not_monitored.items()):
        lines.append(f"| {m} | not monitored: {why} |")
    last: dict[str, dict[str, Any]] = {}
    for r in summary.window_rows:
        last[r["metric"]] = r
    if last:
        lines += ["", "| metric | last value | threshold | status | alarm |", "|---|---|---|---|---|"]
        for metric, r in sorted(last.items()):
            value = "skipped" if r["value"] is None else f"{r['value']:.4f}"
            threshold = "-" if r["threshold"] is None else f"{r['threshold']:.4f}"
            lines.append(f"| {metric} | {value} | {threshold} | {r['status']} | {'**ALARM**' if r['alarm'] else 'no'} |")
    if summary.alarms_raised:
        lines += ["", "| alarm raised | window | value | threshold |", "|---|---|---|---|"]
        for a in summary.alarms_raised[:50]:
            lines.append(f"| {a['metric']} | {format_us(a['window_start'])} .. {format_us(a['window_end'])} | "
                         f"{a['value']:.4f} | {a['threshold']:.4f} |")
    if png:
        lines += ["", f"![drift metrics](data:image/png;base64,{base64.b64encode(png).decode()})"]
    return "\n".join(lines)
