"""A daemon's Prometheus metrics as the bench reads them (``--metrics-listen``)."""

from __future__ import annotations

import re
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


_LE = re.compile(r'([{,])le="([^"]+)"')  # a bucket's bound among its labels


def grown(before: dict[str, float], after: dict[str, float], name: str,
          over: float | None = None) -> tuple[float, float, float, float]:
    """What histogram ``name`` observed between two scrapes, over all its label sets:
    (how many, their sum, the bound of the first bucket that holds them all, how many
    were longer than the bucket bound ``over``)."""
    def grew(sample: str) -> float:
        return after.get(sample, 0.0) - before.get(sample, 0.0)

    count = total = longest = above = 0.0
    series: dict[str, list[tuple[float, float]]] = {}
    for sample in after:
        if sample.startswith(f"{name}_count"):
            count += grew(sample)
        elif sample.startswith(f"{name}_sum"):
            total += grew(sample)
        elif sample.startswith(f"{name}_bucket"):
            le = _LE.search(sample)
            labels = _LE.sub(r"\1", sample)  # the series: its other labels
            series.setdefault(labels, []).append((float(le.group(2)), grew(sample)))
    for buckets in series.values():
        buckets.sort()
        if buckets and buckets[-1][1]:  # cumulative: the first bucket holding them all
            longest = max(longest, next(b for b, n in buckets if n >= buckets[-1][1]))
            if over is not None:
                within = next((n for b, n in buckets if b == over), buckets[-1][1])
                above += buckets[-1][1] - within
    return count, total, longest, above
