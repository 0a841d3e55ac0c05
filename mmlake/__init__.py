"""mmlake: multimodal data pipelines from Kafka into Delta Lake, and a KV cache for inference servers.

The packages, each imported under this one root:

- :mod:`mmlake.ingest`: Kafka source, wire format, exactly-once Delta sink, ordered reader, broker;
- :mod:`mmlake.preprocessing`: ONNX operators, encoders, the features table, backfills;
  :mod:`mmlake.preprocessing.drift`: drift detection;
- :mod:`mmlake.lineage`: OpenLineage emission and the local lineage query;
- :mod:`mmlake.cache`: SafeCache, the KV cache for inference servers;
- :mod:`mmlake.flows`: Prefect flows, deployments and the ``mmlake`` CLI.

This package itself is the ground floor all of them stand on: :mod:`mmlake.errors`,
:mod:`mmlake.settings` and :mod:`mmlake.lake`. Importing it loads none of the packages.
"""

from __future__ import annotations

import pkgutil

from mmlake.errors import CommitConflictError, InputError, MmlakeError

# In a source checkout, a directory on sys.path ahead of the installed tree (the repository root, as
# ``python -m`` and pytest put it first) holds this folder without the subpackages, which the
# installed tree maps from the repository's top-level folders. Let both serve the package.
__path__ = pkgutil.extend_path(__path__, __name__)

__version__ = "0.1.0"

__all__ = ["CommitConflictError", "InputError", "MmlakeError", "__version__"]
