"""``mmlake ops verify``: every model against its recorded hash, and against a fresh regeneration."""

from __future__ import annotations

from dataclasses import dataclass

from mmlake.preprocessing.errors import PreprocessError
from mmlake.preprocessing.registry import Registry, sha256_hex


@dataclass
class Verified:
    ref: str
    recorded: str | None
    on_disk: str | None  # None: a generated model not in the cache yet
    rebuilt: str | None  # None: not regenerated
    problem: str | None = None

    @property
    def ok(self) -> bool:
        return self.problem is None

    def text(self) -> str:
        state = "ok" if self.ok else f"FAILED: {self.problem}"
        return f"{self.ref:34} {state}"


def verify(registry: Registry, *, regenerate: bool = True) -> list[Verified]:
    out = []
    for ref, spec in sorted(registry.models.items()):
        recorded = registry.expected_sha256(spec)
        path = registry.model_path(spec)
        on_disk = sha256_hex(path.read_bytes()) if path.exists() else None
        rebuilt = None
        problems = []
        if recorded is None:
            problems.append("no recorded SHA-256")
        if on_disk is not None and on_disk != recorded:
            problems.append(f"file {path} has SHA-256 {on_disk[:16]}..., recorded {str(recorded)[:16]}...")
        if on_disk is None and not spec.generated:
            problems.append(f"file {path} is missing")
        if regenerate:
            try:
                rebuilt = sha256_hex(registry.build(spec))
            except (PreprocessError, ImportError, ValueError) as err:
                problems.append(f"cannot regenerate: {err}")
            else:
                if rebuilt != recorded:
                    problems.append(f"regeneration gives {rebuilt[:16]}..., recorded {str(recorded)[:16]}...")
        out.append(Verified(ref, recorded, on_disk, rebuilt, "; ".join(problems) or None))
    return out
