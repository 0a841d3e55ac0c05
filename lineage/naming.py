"""Dataset names by the OpenLineage naming spec."""

from __future__ import annotations

import os
from urllib.parse import urlparse


def kafka_dataset(bootstrap: str, topic: str) -> tuple[str, str]:
    """(namespace, name) of a Kafka topic: ``kafka://{first bootstrap host:port}``, the topic."""
    first = bootstrap.split(",")[0].strip()
    return f"kafka://{first}", topic


def storage_dataset(uri: str) -> tuple[str, str]:
    """(namespace, name) of a table by its storage location.

    Local paths: ``file``, the absolute path. Object stores: ``scheme://bucket``, the path in the bucket
    (``s3://b/lake/x`` -> ``("s3://b", "lake/x")``).

    >>> storage_dataset("s3://bucket/lake/demo/raw")
    ('s3://bucket', 'lake/demo/raw')
    """
    if "://" not in uri or uri.startswith("file://"):
        path = uri.removeprefix("file://")
        return "file", os.path.abspath(path)
    parsed = urlparse(uri)
    return f"{parsed.scheme}://{parsed.netloc}", parsed.path.lstrip("/")
