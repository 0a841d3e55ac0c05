# Type stub of ingest/_native.c, the optional C fast path of the wire contract; reach it through
# mmlake.ingest.native.module.
from collections.abc import Sequence

from mmlake.ingest.records import Accepted, Checked

API: int

def check_text(
    key: bytes | None,
    value: bytes | None,
    headers: Sequence[tuple[str, bytes | None]],
    max_payload_bytes: int,
    not_after_us: int | None,
    /,
) -> Checked | None: ...
def accept_many(checked: Sequence[Checked], payloads: Sequence[bytes], /) -> list[Accepted]: ...
def gather(values: Sequence[bytes], target: object, /) -> int: ...
def headers_ok(headers: object, /) -> bool: ...
def configure(checked: type[Checked], accepted: type[Accepted], /) -> None: ...
