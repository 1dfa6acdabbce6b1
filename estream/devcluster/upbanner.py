"""What ``estream up`` prints once its cluster is ready: where every process listens, its
metrics, data dir, TLS files and cluster secret, and a first command to try. Pure: builds
strings from the plan (:mod:`estream.devcluster.up`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from estream.devcluster.up import ClusterPlan


def banner(plan: ClusterPlan, elapsed_s: float) -> str:
    """What ``estream up`` prints once the cluster is ready."""
    admin = plan.admin_urls
    return "\n".join(
        [
            f"estream cluster ready in {elapsed_s:.1f}s",
            f"  PD addresses:  {plan.pd_addresses}",
            f"  admin API:     {admin[0]}"
            + (
                f"  (also {', '.join(':' + a.rpartition(':')[2] for a in admin[1:])})"
                if admin[1:]
                else ""
            ),
            f"  range servers: {', '.join(c.address for c in plan.range_servers)}",
            *([f"  kafka: {plan.kafka_addresses}"] if plan.kafka else []),
            f"  metrics:       {_metrics_urls(plan)}",
            f"  data dir:      {plan.data_dir}   logs: {plan.data_dir / 'logs'}",
            *_tls_lines(plan),
            *_secret_lines(plan),
            f"  try:           {_client_env(plan)}ESTREAM_PD={plan.pd_addresses} "
            "estream cluster status",
            "Press Ctrl-C to stop.",
        ]
    )


def _client_env(plan: ClusterPlan) -> str:
    env = plan.tls.client_env() if plan.tls is not None else {}
    return "".join(f"{k}={v} " for k, v in env.items())


def _tls_lines(plan: ClusterPlan) -> list[str]:
    if plan.tls is None:
        return []
    return [f"  TLS:           CA {plan.tls.ca}, token file {plan.tls.token} "
            f"(client certificate {plan.tls.client_cert})"]


def _secret_lines(plan: ClusterPlan) -> list[str]:
    if plan.secret_file is None:
        return []
    return [f"  secret:        {plan.secret_file} (the member credential; range servers verify "
            "hmac-sha256 streams' MACs; clients of such streams: "
            f'ESTREAM_SECRET="$(cat {plan.secret_file})" or connect(secret=...))']


def _metrics_urls(plan: ClusterPlan) -> str:
    """Every process's /metrics: the PD admin ports and the range servers' --http ports."""
    scheme = "https" if getattr(plan, "tls", None) is not None else "http"
    ports = [c.http.rpartition(":")[2] for c in plan.children if c.http]
    return f"{scheme}://{plan.host}:{{{','.join(ports)}}}/metrics"
