"""Which failed task attempts Prefect retries: only those a later attempt can get past.

Every stage is exactly-once through the Delta log, so a retry resumes from the last commit and is
always safe; retrying an error that will recur (bad input, a missing topic) only delays the report.
"""

from __future__ import annotations

from typing import Any

from mmlake.errors import CommitConflictError
from mmlake.ingest.errors import BrokerUnavailableError


def _failed_with(state: Any, transient: tuple[type[BaseException], ...]) -> bool:
    try:
        state.result()
    except transient:
        return True
    except Exception:
        return False
    return False


def ingest_is_transient(task: Any, task_run: Any, state: Any) -> bool:
    """Retry ingest on a broker that went away and on a lost commit race."""
    return _failed_with(state, (BrokerUnavailableError, CommitConflictError))


def commit_is_transient(task: Any, task_run: Any, state: Any) -> bool:
    """Retry preprocessing and drift on a lost commit race."""
    return _failed_with(state, (CommitConflictError,))
