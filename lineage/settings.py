"""mmlake's own lineage settings (the transport is OpenLineage's standard configuration)."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from mmlake.settings import Settings


class LineageSettings(Settings):
    """mmlake's own lineage settings (the transport is OpenLineage's standard configuration)."""

    model_config = SettingsConfigDict(env_prefix="MMLAKE_LINEAGE_")

    namespace: str = Field("mmlake", description="OpenLineage job namespace of mmlake's flows and tasks.")
    timeout_s: float = Field(5.0, gt=0, description="Longest an emission may hold up a flow, seconds.")
