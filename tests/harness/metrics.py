"""A counter summed over the PD nodes' ``/metrics``, for tests that count what PD did.

Side effects: one HTTP request per PD node.
"""

from __future__ import annotations

from estream.devcluster.cluster import Cluster
from estream.devcluster.pd import http_json


def pd_metric_total(cluster: Cluster, prefix: str, *contains: str) -> int:
    """The sum, over the PD nodes that answer, of the samples whose line starts with
    ``prefix`` and holds every string of ``contains`` (label pairs)."""
    total = 0
    for url in cluster.pd.http_urls:
        try:
            status, text = http_json(url + "/metrics", timeout_s=2.0)
        except OSError:
            continue
        if status != 200:
            continue
        total += sum(int(float(line.split()[-1])) for line in str(text).splitlines()
                     if line.startswith(prefix) and all(c in line for c in contains))
    return total
