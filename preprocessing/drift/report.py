"""What a drift run shows people: a markdown table and a PNG plot of each metric against event time,
thresholds drawn, alarms marked; and the one-line summary the CLI prints."""

from __future__ import annotations

import base64
import io
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from mmlake.lake import StreamTables, format_us, is_local, scan
from mmlake.preprocessing.drift.run import DriftSummary


@dataclass(frozen=True)
class Report:
    """A drift run's artifact: the markdown (plot embedded), whether the encoders were trained, and
    where the plot was saved (local lakes only)."""

    markdown: str
    encoder_trained: bool | None
    plot: str | None
    untrained: tuple[str, ...] = ()  # the modalities with rows from untrained encoders


def report(tables: StreamTables, summary: DriftSummary) -> Report:
    """The artifact of a drift run over ``tables``: the drift table's recent windows plotted (also
    saved to ``<lake>/_plots/drift-<stream>.png`` on a local lake) and the run's summary."""
    drift_dt = tables.open("drift")
    png = plot_png(recent_rows(drift_dt), f"drift of {tables.stream}") if drift_dt is not None else None
    untrained = untrained_modalities(tables)
    trained = None if untrained is None else not untrained
    return Report(
        markdown(summary, png, untrained or ()),
        trained,
        save_plot(tables.lake, tables.stream, png),
        tuple(untrained or ()),
    )


@dataclass(frozen=True)
class DriftResult:
    """What a drift run did and what it shows: its summary, whether the embeddings came from trained
    encoders (None: no features yet), and where the plot was saved (local lakes only)."""

    summary: DriftSummary
    encoder_trained: bool | None = None
    untrained_modalities: tuple[str, ...] = ()
    plot: str | None = None

    @classmethod
    def of(cls, summary: DriftSummary, shown: Report) -> DriftResult:
        return cls(summary, shown.encoder_trained, shown.untrained, shown.plot)

    def line(self) -> str:
        """The one-line summary the CLI prints, saying when the embeddings came from untrained encoders."""
        line = self.summary.line()
        if self.untrained_modalities:
            return line + f" ({', '.join(self.untrained_modalities)} embeddings from UNTRAINED seeded encoders)"
        return line + (" (embeddings from UNTRAINED seeded encoders)" if self.encoder_trained is False else "")


def untrained_modalities(tables: StreamTables) -> list[str] | None:
    """The modalities with features rows from an untrained encoder, sorted (None: no features yet)."""
    import pyarrow.compute as pc

    dt = tables.open("features")
    if dt is None:
        return None
    rows = scan(dt, ["modality", "encoder_trained"])
    if rows.num_rows == 0:
        return None
    untrained = rows.filter(pc.invert(rows.column("encoder_trained")))
    return sorted(set(untrained.column("modality").to_pylist()))


def save_plot(lake: str, stream: str, png: bytes | None) -> str | None:
    """On a local lake, the plot goes to ``<lake>/_plots/drift-<stream>.png``; its path, or None."""
    if png is None or not is_local(lake):
        return None
    folder = Path(lake.removeprefix("file://")) / "_plots"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"drift-{stream}.png"
    path.write_bytes(png)
    return str(path.resolve())


def recent_rows(drift_dt: Any, windows: int = 600) -> list[dict[str, Any]]:
    """The drift table's last ``windows`` windows (every metric), timestamps as epoch µs, for the plot."""
    import pyarrow as pa
    import pyarrow.compute as pc

    table = scan(
        drift_dt,
        ["window_start", "window_end", "first_sample", "metric", "value", "threshold_low", "threshold_high", "alarm"],
    )
    starts = sorted(set(table.column("first_sample").to_pylist()))
    if not starts:
        return []
    table = table.filter(pc.greater_equal(table.column("first_sample"), starts[-windows:][0]))
    for key in ("window_start", "window_end"):
        table = table.set_column(table.schema.get_field_index(key), key, pc.cast(table.column(key), pa.int64()))
    return table.to_pylist()


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
    for ax in axes.ravel()[len(metrics) :]:
        ax.set_visible(False)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80)
    plt.close(fig)
    return buf.getvalue()


def markdown(summary: DriftSummary, png: bytes | None, untrained: list[str] | tuple[str, ...]) -> str:
    lines = [f"### Drift of `{summary.stream}`", "", summary.line(), ""]
    if untrained:
        lines += [
            f"**The {', '.join(untrained)} embeddings come from UNTRAINED (seeded) encoders**: their codes "
            "reflect low-level statistics, not meaning.",
            "",
        ]
    lines += [
        "| | |",
        "|---|---|",
        f"| samples scored | {summary.samples} |",
        f"| windows | {summary.windows} |",
        f"| codebook | `{(summary.codebook_sha256 or '')[:16]}` |",
        f"| metric-windows skipped (too few valid parts) | {summary.skipped_metrics} |",
    ]
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
            lines.append(
                f"| {metric} | {value} | {threshold} | {r['status']} | {'**ALARM**' if r['alarm'] else 'no'} |"
            )
    if summary.alarms_raised:
        lines += ["", "| alarm raised | window | value | threshold |", "|---|---|---|---|"]
        for a in summary.alarms_raised[:50]:
            lines.append(
                f"| {a['metric']} | {format_us(a['window_start'])} .. {format_us(a['window_end'])} | "
                f"{a['value']:.4f} | {a['threshold']:.4f} |"
            )
    if png:
        lines += ["", f"![drift metrics](data:image/png;base64,{base64.b64encode(png).decode()})"]
    return "\n".join(lines)
