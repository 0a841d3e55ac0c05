"""The drift detector's state, kept in the custom metadata of each drift commit (so it is atomic with
the windows it follows), as a typed, versioned model."""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict

#: The commit-metadata key holding the state.
STATE_KEY = "mmlake.drift.state"
#: The version this code writes. States written before versions were recorded read as version 1.
STATE_VERSION = 1


class DriftState(BaseModel):
    """Where a stream's drift scoring stands after a commit."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    version: int = STATE_VERSION
    codebook_sha256: str
    config_sha256: str
    config: dict[str, Any]  # the detector configuration scored with (DriftConfig's fields)
    operators: dict[str, str | None]  # modality -> SHA-256 of the operator whose embeddings were scored
    consumed: int  # samples consumed since the stream's first, the reference included
    cursor: tuple[int, str]  # (event time µs, sample id) of the last sample consumed
    offset: int | None = None  # the first scored sample's index (None in early states: the reference size)
    reference_range: tuple[int, int] | None = None  # the pinned reference range, epoch µs [lo, hi)
    detector: dict[str, Any]  # the detector's own state (EWMA statistics, the next window's head)

    def to_json(self) -> str:
        """The state as the commit metadata holds it (keys sorted: the same state, the same text)."""
        return json.dumps(self.model_dump(mode="json"), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> DriftState:
        return cls.model_validate(json.loads(text))


def latest_state(dt: Any) -> DriftState | None:
    """The detector state of the newest commit of the drift table ``dt`` that carries one."""
    if dt is None:
        return None
    for entry in dt.history():
        if STATE_KEY in entry:
            return DriftState.from_json(entry[STATE_KEY])
    return None
