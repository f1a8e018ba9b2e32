"""The bench reads the daemon's histograms between two scrapes (tests/bench/metrics.py):
the counts it reports must be the observations made between them, per label set."""

from __future__ import annotations

from .bench.load import fsyncs, gc_pauses, turns
from .bench.metrics import grown

NAME = "worldline_metadata_fsync_seconds"


def _scrape(counts: dict[str, list[int]], sums: dict[str, float]) -> dict[str, float]:
    """A scrape of histogram NAME: per file, cumulative counts at bounds 0.001, 0.025,
    0.25 and +Inf."""
    out: dict[str, float] = {}
    for file, cumulative in counts.items():
        for bound, n in zip(("0.001", "0.025", "0.25", "+Inf"), cumulative, strict=True):
            out[f'{NAME}_bucket{{file="{file}",le="{bound}"}}'] = float(n)
        out[f'{NAME}_count{{file="{file}"}}'] = float(cumulative[-1])
        out[f'{NAME}_sum{{file="{file}"}}'] = sums[file]
        out[f'{NAME}_created{{file="{file}"}}'] = 1.7e9
    return out


def test_a_histogram_grows_by_what_was_observed_between_two_scrapes():
    # labels whose names end in "le" ("file") are not taken for a bucket's bound
    before = _scrape({"meta.db": [5, 6, 6, 6], "graphs.db": [1, 1, 1, 1]},
                     {"meta.db": 0.01, "graphs.db": 0.0005})
    after = _scrape({"meta.db": [9, 12, 13, 13], "graphs.db": [1, 1, 1, 2]},
                    {"meta.db": 0.2, "graphs.db": 0.6005})
    count, total, longest, above = grown(before, after, NAME, over=0.025)
    assert count == 8  # 7 of meta.db, 1 of graphs.db
    assert abs(total - 0.79) < 1e-9
    assert longest == float("inf")  # graphs.db's one was past the last bound
    assert above == 2  # meta.db's one in (0.025, 0.25], graphs.db's past it
    count, _, longest, above = grown(before, _scrape(
        {"meta.db": [9, 12, 13, 13], "graphs.db": [1, 1, 1, 1]},
        {"meta.db": 0.2, "graphs.db": 0.0005}), NAME, over=0.025)
    assert (count, longest, above) == (7, 0.25, 1)


def test_the_throughput_case_says_when_nothing_was_observed():
    assert gc_pauses({}, {}) == "no GC pause during the load"
    assert fsyncs({}, {}) == "no metadata fsync during the load"
    same = _scrape({"meta.db": [3, 3, 3, 3]}, {"meta.db": 0.003})
    assert fsyncs(same, same) == "no metadata fsync during the load"
    assert turns({}, {}, 10.0) == "no turn at the admission gate during the load"


def _gate(count: int, held: float, waited: float, cpu: float) -> dict[str, float]:
    """A scrape of the admission gate's metrics: ``count`` turns, all within 5 ms."""
    out = {"worldline_admission_turn_cpu_seconds_total": cpu}
    for name, total in (("turn", held), ("wait", waited)):
        full = f"worldline_admission_{name}_seconds"
        out.update({f'{full}_bucket{{le="0.005"}}': float(count),
                    f'{full}_bucket{{le="+Inf"}}': float(count),
                    f"{full}_count": float(count), f"{full}_sum": total})
    return out


def test_the_throughput_case_reports_the_admission_gate_over_the_load():
    before = _gate(100, 0.5, 2.0, 0.4)
    after = _gate(1100, 6.5, 42.0, 5.4)  # 1000 turns of 6 ms in 10 s, 5 ms of CPU each
    assert turns(before, after, 10.0) == (
        "1000 turns at the admission gate, one held 60% of the load, a turn 6.00 ms"
        " (5.00 ms of its thread's CPU), a checkpoint's wait for one 40.00 ms")
