"""A daemon's Prometheus metrics as the bench reads them (``--metrics-listen``)."""

from __future__ import annotations

import urllib.request

PUTS = 'worldline_bucket_requests_total{op="put"}'


def scrape(metrics: str) -> dict[str, float]:
    """The metrics the daemon serves at ``metrics`` (host:port): sample -> value. A
    counter not yet incremented has no sample: read with ``.get(sample, 0.0)``."""
    with urllib.request.urlopen(f"http://{metrics}/metrics", timeout=10) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            sample, _, value = line.rpartition(" ")
            out[sample] = float(value)
    return out
