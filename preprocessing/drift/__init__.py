"""Entropy-based multimodal drift detection over a stream's features (see docs/drift.md).

- :mod:`.measures`: entropy, mutual information, KL/JS divergence over code counts;
- :mod:`.codebook`: the pinned spherical k-means codebook per modality;
- :mod:`.ewma`: adaptive thresholds that raise and clear alarms;
- :mod:`.detector`: sliding windows and their metrics;
- :mod:`.settings`: ``MMLAKE_DRIFT_...``;
- :mod:`.run`: incremental, exactly-once runs over the features table into the drift table;
- :mod:`.report`: the markdown and the plot; :mod:`.streams`: generated streams with change points.
"""

from mmlake.preprocessing.drift.detector import Detector, DriftConfig, Reference, Samples
from mmlake.preprocessing.drift.run import DriftSummary, run_drift
from mmlake.preprocessing.drift.settings import DriftSettings

__all__ = ["Detector", "DriftConfig", "DriftSettings", "DriftSummary", "Reference", "Samples", "run_drift"]
