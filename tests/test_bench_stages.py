"""`make stages` (tests/bench/stages.py) times a checkpoint's stages in the daemon's own
process: each stage is timed on every checkpoint, nested stages fit inside the
checkpoint that holds them, and the daemon's methods are as they were afterwards."""

from __future__ import annotations

import json

from .conftest import run_python

SCRIPT = """
import json
from pathlib import Path
from tests.bench import stages
from worldline.daemon.world.checkpoint import Checkpoints
original = Checkpoints.__dict__["checkpoint"], Checkpoints.__dict__["_admitted"]
results = stages.run("edits", 12, Path({cache!r}), sql=True, files=300)
after = Checkpoints.__dict__["checkpoint"], Checkpoints.__dict__["_admitted"]
print(json.dumps({{"results": results, "restored": after == original,
                  "stages": [name for _, _, name in stages.STAGES], "whole": stages.WHOLE,
                  "report": stages.report(results)}}))
"""


def test_each_stage_is_timed_within_its_checkpoint_and_the_timers_are_removed(tmp_path):
    out = json.loads(run_python(SCRIPT.format(cache=str(tmp_path / "cache")), timeout=120))
    results = out["results"]
    assert out["restored"]
    assert len(results["client"]) == 12
    for name in out["stages"]:  # the edits reach every stage, every time
        assert len(results[name]) == 12, name
    whole = results[out["whole"]]
    capture = results["capture (all layers, state, tasks)"]
    commit = results["commit"]
    fsync = results["fsync of the log"]
    for i in range(12):
        assert results["client"][i] >= whole[i] >= capture[i] + commit[i] + fsync[i] > 0
        assert capture[i] >= results["    folders updated"][i] > 0
    assert len(results["sql: COMMIT"]) == 12  # the statements of each checkpoint
    assert out["report"].startswith("12 checkpoints")
    assert "fsync of the log" in out["report"] and "sql: COMMIT" in out["report"]
