"""What one ingest run committed, as the run's callers (the flow, the CLI, the lineage events) see it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from mmlake.lake import format_us

if TYPE_CHECKING:
    from mmlake.ingest.routing import Batch


@dataclass
class IngestSummary:
    """What one ingest run committed. ``offsets`` maps partition -> [first read, last committed]."""

    stream: str
    topic: str
    accepted: int = 0
    late: int = 0
    duplicates: int = 0
    dead_lettered: int = 0
    batches: int = 0
    conflicts: int = 0
    offsets: dict[int, list[int]] = field(default_factory=dict)
    watermark_us: int | None = None
    payload_bytes: int = 0

    @property
    def watermark(self) -> str:
        return format_us(self.watermark_us)

    def line(self) -> str:
        """The one-line summary the CLI prints."""
        spans = ",".join(f"{p}:{a}-{b}" for p, (a, b) in sorted(self.offsets.items())) or "none"
        retried = f" commit_conflicts_retried={self.conflicts}" if self.conflicts else ""
        return (
            f"ingested stream={self.stream} topic={self.topic}: accepted={self.accepted} "
            f"late={self.late} duplicates={self.duplicates} dead_lettered={self.dead_lettered} "
            f"batches={self.batches} offsets={spans} watermark={self.watermark}{retried}"
        )

    def account(self, batch: Batch, appended: dict[str, int]) -> None:
        """Count ``batch`` once it committed (``appended``: the rows each table took)."""
        summary = self
        summary.dead_lettered += appended.get("dlq", 0)
        summary.late += appended.get("late", 0)
        if "raw" in appended:
            summary.accepted += appended["raw"]
            summary.duplicates += batch.duplicates
            summary.payload_bytes += batch.rows["raw"].payload_bytes()
        for p, last in batch.last_offset.items():
            span = summary.offsets.setdefault(p, [batch.first_offset[p], last])
            span[1] = last
        summary.batches += 1


def spans(records: Sequence[Any]) -> str:
    """``partition 0 offsets 10-20, partition 1 offset 7``: where a batch lies, for error messages."""
    bounds: dict[int, list[int]] = {}
    for rec in records:
        span = bounds.setdefault(rec.partition, [rec.offset, rec.offset])
        span[0], span[1] = min(span[0], rec.offset), max(span[1], rec.offset)
    return ", ".join(
        f"partition {p} offset{'s' if a != b else ''} {a}{f'-{b}' if a != b else ''}"
        for p, (a, b) in sorted(bounds.items())
    )
