"""Observability: Prometheus metrics and structured JSON logs with request ids.

Metrics (``--metrics-listen HOST:PORT`` serves them at /metrics):
  worldline_rpc_duration_seconds{method,code}  histogram: every call, checkpoints,
                                               restores and forks among them
  worldline_blob_bytes_written_total            bytes the blob store wrote
  worldline_blob_bytes_reused_total             bytes a put found already stored
  worldline_dedup_ratio                         reused / (reused + written)
  worldline_pending_approvals                   approvals waiting for an operator
  worldline_tracker_fallbacks_total             full scans forced by overflow, limits...
  worldline_gate_bypasses_total                 gated tool calls that ran without an
                                               approval (recorded as gate bypasses)
  worldline_bucket_requests_total{op}           requests to the fleet's bucket (put, get,
                                               delete)
  worldline_staged_bytes                        bytes this host's checkpoints staged in the
                                               metadata store, not yet in the bucket
  worldline_moved_objects                       objects this host moved to the bucket from
                                               there, not yet rewritten at rest
  worldline_gc_pause_seconds{generation}        histogram: the cycle collector's pauses
                                               (each stops every call: one interpreter lock)
  worldline_metadata_fsync_seconds{file}        histogram: fsyncs of an embedded store's
                                               write-ahead log (meta.db, graphs.db), which
                                               every acknowledged write waits for
  worldline_wal_copy_seconds{file}              histogram: its log copied into the file,
                                               beside the writers (wal.py)
  worldline_admission_wait_seconds              histogram: an incremental checkpoint's wait
                                               for its turn at the admission gate
  worldline_admission_turn_seconds              histogram: the turn it then held (its
                                               capture and its commit's Python work)
  worldline_admission_turn_cpu_seconds_total    the CPU the turns' own threads used: the
                                               rest of a turn waited (for the interpreter
                                               lock, or the disk)

Logs (``--log-format json``): one JSON object a line, with the request id of the
call being served (the caller's ``x-request-id`` metadata, else a new one). The edge
times the calls and sets the request id (daemon/edge/metrics.py): this module imports
no grpc, so the domain that counts here does not either.
"""

from __future__ import annotations

import bisect
import contextvars
import json
import logging
import threading
import time

from prometheus_client import REGISTRY, Counter, Gauge, Histogram
from prometheus_client.core import HistogramMetricFamily

REQUEST_ID: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="")

RPC_SECONDS = Histogram("worldline_rpc_duration_seconds", "Time to answer a call",
                        ["method", "code"],
                        buckets=(.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10))
BLOB_WRITTEN = Counter("worldline_blob_bytes_written_total", "Bytes the blob store wrote")
BLOB_REUSED = Counter("worldline_blob_bytes_reused_total",
                      "Bytes a put found already stored (deduplicated)")
RESTORE_COPIED = Counter("worldline_restore_copied_bytes_total", "Bytes of big files a"
                         " restore copied from the file on disk, not the store")
DEDUP = Gauge("worldline_dedup_ratio", "Share of put bytes found already stored")
DEDUP.set_function(lambda: BLOB_REUSED._value.get() / max(
    1.0, BLOB_REUSED._value.get() + BLOB_WRITTEN._value.get()))
PENDING_APPROVALS = Gauge("worldline_pending_approvals", "Approvals waiting for a decision")
CHECKPOINTS = Counter("worldline_checkpoints_total",
                      "Checkpoints taken through this daemon, by kind (checkpoint, restore)",
                      ["kind"])
ROLLBACK_RATE = Gauge("worldline_rollback_rate",
                      "Restores per 100 checkpoints taken through this daemon since it started")
ROLLBACK_RATE.set_function(lambda: 100.0 * CHECKPOINTS.labels("restore")._value.get() / max(
    1.0, CHECKPOINTS.labels("checkpoint")._value.get()))
GATE_BYPASSES = Counter("worldline_gate_bypasses_total",
                        "Gated tool calls recorded as having run without an approval")
TRACKER_FALLBACKS = Counter("worldline_tracker_fallbacks_total",
                            "Captures forced to scan everything (overflow, watch limit, ...)")
BUCKET_REQUESTS = Counter("worldline_bucket_requests_total",
                          "Requests to the fleet's bucket", ["op"])
STAGED_BYTES = Gauge("worldline_staged_bytes", "Bytes this host's checkpoints staged in"
                     " the metadata store, not yet moved to the bucket")
MOVED_OBJECTS = Gauge("worldline_moved_objects", "Objects this host moved to the bucket"
                      " from the metadata store, not yet rewritten at rest")

# The disk's waits: a fsync of a few pages takes a fraction of a millisecond on an idle
# SSD; the tail a call sees comes from the ones that stall behind the device.
DISK_BUCKETS = (.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1.0, 2.5)
METADATA_FSYNC = Histogram("worldline_metadata_fsync_seconds", "fsyncs of an embedded"
                           " store's write-ahead log (every acknowledged write waits for"
                           " one)", ["file"], buckets=DISK_BUCKETS)
WAL_COPY = Histogram("worldline_wal_copy_seconds", "An embedded store's write-ahead log"
                     " copied into its file (beside the writers)", ["file"],
                     buckets=DISK_BUCKETS)

# The admission gate (capture/admission.py): under load, a checkpoint's latency is its
# wait for a turn, and the checkpoints a second are one over the turn's length.
TURN_BUCKETS = (.001, .0025, .005, .0075, .01, .025, .05, .1, .25, .5, 1.0, 2.5)
ADMISSION_WAIT = Histogram("worldline_admission_wait_seconds", "An incremental"
                           " checkpoint's wait for its turn at the admission gate",
                           buckets=TURN_BUCKETS)
ADMISSION_TURN = Histogram("worldline_admission_turn_seconds", "A turn held at the"
                           " admission gate (a capture and its commit's Python work)",
                           buckets=TURN_BUCKETS)
ADMISSION_TURN_CPU = Counter("worldline_admission_turn_cpu_seconds", "CPU the turns'"
                             " threads used during them")

GC_BUCKETS = (.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1.0, float("inf"))


class GcPauses:
    """``worldline_gc_pause_seconds``: the cycle collector's pauses, by generation, as a
    histogram. Counted by a ``gc.callbacks`` hook with no lock (a collection may start
    inside any code, a lock's holder included: a metric's own lock would deadlock it),
    and read when metrics are scraped."""

    def __init__(self) -> None:
        self.counts = {g: [0] * len(GC_BUCKETS) for g in (0, 1, 2)}
        self.sums = {g: 0.0 for g in (0, 1, 2)}
        self._started: float | None = None

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        elif self._started is not None:
            took = time.perf_counter() - self._started
            self._started = None
            generation = info["generation"]
            self.sums[generation] += took
            self.counts[generation][bisect.bisect_left(GC_BUCKETS, took)] += 1

    def collect(self):
        family = HistogramMetricFamily("worldline_gc_pause_seconds", "The cycle collector's"
                                       " pauses (every call waits for each)",
                                       labels=["generation"])
        for generation, counts in self.counts.items():
            total, buckets = 0, []
            for bound, n in zip(GC_BUCKETS, counts, strict=True):
                total += n
                buckets.append(("+Inf" if bound == float("inf") else str(bound), total))
            family.add_metric([str(generation)], buckets, self.sums[generation])
        yield family


GC_PAUSES = GcPauses()


def watch_gc() -> None:
    """Time the cycle collector's pauses from now on (once per process)."""
    import gc
    if GC_PAUSES not in gc.callbacks:
        gc.callbacks.append(GC_PAUSES)
        REGISTRY.register(GC_PAUSES)


class Activity:
    """Calls in flight, and when the last one ended: background work (the idle repack)
    waits until the daemon has been quiet for a while."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.in_flight = 0
        self.last = time.monotonic()

    def begin(self) -> None:
        with self._lock:
            self.in_flight += 1

    def end(self) -> None:
        with self._lock:
            self.in_flight -= 1
            self.last = time.monotonic()

    def quiet_for(self) -> float:
        """Seconds since the last call ended; 0 while one is in flight."""
        return 0.0 if self.in_flight else time.monotonic() - self.last


ACTIVITY = Activity()


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc = {"time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{record.msecs:03.0f}Z",
               "level": record.levelname, "logger": record.name,
               "message": record.getMessage()}
        if REQUEST_ID.get():
            doc["request_id"] = REQUEST_ID.get()
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return json.dumps(doc, ensure_ascii=False)
