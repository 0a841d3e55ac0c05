"""The settings base every subsystem's settings extend, and the lake's own settings.

Each subsystem has one pydantic-settings model with ``MMLAKE_...`` environment variables (ingest:
``MMLAKE_``, preprocessing: ``MMLAKE_PREPROCESS_``, drift: ``MMLAKE_DRIFT_``, cache:
``MMLAKE_CACHE_``, lineage: ``MMLAKE_LINEAGE_``). The CLI and the Prefect flows build the same models:
explicit arguments override the environment, which overrides the defaults.
"""

from __future__ import annotations

from typing import Any, Self

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from mmlake.lake import StreamTables


class Settings(BaseSettings):
    """Frozen settings read from the environment; subclasses set ``env_prefix``."""

    model_config = SettingsConfigDict(extra="ignore", frozen=True)

    def with_overrides(self, **overrides: Any) -> Self:
        """A copy with the given fields replaced; ``None`` values are ignored (not given)."""
        values = {k: v for k, v in overrides.items() if v is not None}
        if not values:
            return self
        # model_validate checks the new values without reading the environment again; passing only
        # the fields given so far keeps ``model_fields_set`` true (what a user chose, not a default).
        # Read as attributes, not dumped: a field left out of dumps (credentials) is carried too.
        return type(self).model_validate({**{k: getattr(self, k) for k in self.model_fields_set}, **values})


class LakeSettings(Settings):
    """Where the lake is. Every field is bound to ``MMLAKE_<FIELD NAME>``; every stage reads these."""

    model_config = SettingsConfigDict(env_prefix="MMLAKE_")

    lake: str = Field(
        "./lake",
        description="Lake root: a local path or an object-store URI (s3://, gs://, az://).",
    )
    storage_options: dict[str, str] = Field(
        default_factory=dict,
        description="deltalake storage_options for an object-store lake, as a JSON object.",
        # Credentials: never dumped (so never stored as a Prefect flow-run parameter); a flow run on
        # another worker reads them from that worker's environment.
        exclude=True,
        repr=False,
    )

    def tables(self, stream: str) -> StreamTables:
        """The locations of ``stream``'s tables in this lake."""
        return StreamTables(self.lake, stream, dict(self.storage_options))
