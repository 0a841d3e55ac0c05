"""The stages a pipeline or backfill run may be asked for, checked before anything starts (the CLI
checks them before Prefect is imported and its API chosen)."""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field

from mmlake.errors import InputError
from mmlake.lake import time_range

PIPELINE_STAGES = ("ingest", "preprocess", "drift")
BACKFILL_STAGES = ("preprocess", "drift")


def artifact_key(kind: str, stream: str) -> str:
    """The key of a stream's Prefect artifacts of one kind (``ingest``, ``drift``, ...): Prefect takes
    lowercase letters, digits and dashes only, so any valid stream name gives a valid key.

    >>> artifact_key("ingest", "Frames_v2.hd")
    'ingest-frames-v2-hd'
    """
    return re.sub(r"[^a-z0-9-]", "-", f"{kind}-{stream}".lower())


def parse_stages(stages: str | list[str] | None, allowed: tuple[str, ...], what: str) -> list[str]:
    """``stages`` (comma-separated or a list; None: all) in ``allowed``'s order; an unknown one is an
    :class:`InputError` naming the choices.

    >>> parse_stages("drift, ingest", PIPELINE_STAGES, "pipeline")
    ['ingest', 'drift']
    """
    items = stages.split(",") if isinstance(stages, str) else list(stages or allowed)
    chosen = [s.strip() for s in items if s.strip()]
    unknown = sorted(set(chosen) - set(allowed))
    if unknown or not chosen:
        raise InputError(
            f"unknown {what} stage(s) {', '.join(unknown) or '(none given)'}: choose from {', '.join(allowed)}"
        )
    return [s for s in allowed if s in chosen]


def parse_pipeline_stages(stages: str | list[str] | None) -> list[str]:
    return parse_stages(stages, PIPELINE_STAGES, "pipeline")


def parse_backfill_stages(stages: str | list[str] | None) -> list[str]:
    return parse_stages(stages, BACKFILL_STAGES, "backfill")


class BackfillPlan(BaseModel):
    """What a backfill re-runs: an event-time range ``start <= event time < end`` (RFC 3339 or epoch ms)
    through ``stages`` (``preprocess``, ``drift``), with one operator or the defaults."""

    model_config = ConfigDict(frozen=True)

    start: str = Field(description="First event time of the range (inclusive).")
    end: str = Field(description="End of the range (exclusive).")
    stages: str = Field(",".join(BACKFILL_STAGES), description="What to re-run, comma-separated, in order.")
    operator: str | None = Field(None, description="Only this operator's modality (NAME@VERSION).")
    force: bool = Field(False, description="Rewrite even a range that is already up to date.")

    def bounds_us(self) -> tuple[int, int]:
        """The range as epoch µs; a one-line :class:`InputError` unless start < end."""
        return time_range(self.start, self.end)

    def stage_list(self) -> list[str]:
        """The stages, checked (a one-line :class:`InputError` for an unknown one), in running order."""
        return parse_backfill_stages(self.stages)

    def day(self, start: str, end: str) -> BackfillPlan:
        """The same plan for one day of the range."""
        return self.model_copy(update={"start": start, "end": end})


def backfill_run_name(*, with_stages: bool) -> str:
    """The name of the running backfill flow run, from its ``stream`` and ``plan`` parameters:
    ``backfill <stream> <start>..<end>``, and `` (<stages>)`` ``with_stages``."""
    from prefect.runtime import flow_run

    parameters = flow_run.parameters
    plan = BackfillPlan.model_validate(parameters["plan"])
    name = f"backfill {parameters['stream']} {plan.start}..{plan.end}"
    return f"{name} ({plan.stages})" if with_stages else name
