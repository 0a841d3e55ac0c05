"""The stages a pipeline or backfill run may be asked for, checked before anything starts (the CLI
checks them before Prefect is imported and its API chosen)."""

from __future__ import annotations

from mmlake.errors import InputError

PIPELINE_STAGES = ("ingest", "preprocess", "drift")
BACKFILL_STAGES = ("preprocess", "drift")


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
        raise InputError(f"unknown {what} stage(s) {', '.join(unknown) or '(none given)'}: "
                         f"choose from {', '.join(allowed)}")
    return [s for s in allowed if s in chosen]


def parse_pipeline_stages(stages: str | list[str] | None) -> list[str]:
    return parse_stages(stages, PIPELINE_STAGES, "pipeline")


def parse_backfill_stages(stages: str | list[str] | None) -> list[str]:
    return parse_stages(stages, BACKFILL_STAGES, "backfill")
