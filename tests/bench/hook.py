"""The hook case: the whole `worldline hook claude-code` process, from exec to exit, as
Claude Code runs it around every tool call on the Django tree, beside the agent-side
cost it replaces (`git add -A && git commit` per tool call, as Cline and Roo do)."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path


def case(bench):
    from . import peers
    from .run import ROUNDS, WARMUP, Case, stat
    from .trees import edit, pick_files
    worldline = str(Path(sys.executable).with_name("worldline"))
    ws, repo = bench.copy("hook-wl"), bench.copy("hook-git")
    peers.git_init(repo)
    transcript = bench.run_dir / "hook-transcript.jsonl"
    env = {**os.environ, "WORLDLINE_HOOK_STATE": str(bench.run_dir / "hook-state")}
    base = {"session_id": "bench-session", "transcript_path": str(transcript),
            "cwd": str(ws), "permission_mode": "default"}

    def hook(payload: dict) -> float:
        text = json.dumps(payload)
        t = time.perf_counter()
        res = subprocess.run([worldline, "hook", "claude-code", "--address",
                              bench.daemon.address], input=text, capture_output=True,
                             text=True, env=env)
        elapsed = time.perf_counter() - t
        if res.returncode != 0 or "fail open" in res.stderr:
            raise RuntimeError(f"the hook failed: {res.stderr.strip()}")
        return elapsed

    hook({**base, "hook_event_name": "SessionStart", "source": "startup"})
    rng = random.Random(7)
    post, pre, git = [], [], []
    for i in range(WARMUP + ROUNDS):
        files = pick_files(bench.django, rng)
        tool = {"tool_name": "Edit", "tool_use_id": f"toolu_{i}",
                "tool_input": {"file_path": str(ws / files[0]), "old_string": "x",
                               "new_string": "y"}}
        t_pre = hook({**base, "hook_event_name": "PreToolUse", **tool})
        edit(ws, files, f"hook {i}")
        with open(transcript, "a") as f:  # what the agent said and did meanwhile
            for role in ("assistant", "user"):
                f.write(json.dumps({"type": role, "uuid": f"{role}-{i}", "message": {
                    "role": role, "content": f"step {i}: editing {files[0]}"}}) + "\n")
        t_post = hook({**base, "hook_event_name": "PostToolUse", **tool,
                       "tool_response": {"filePath": str(ws / files[0]), "success": True}})
        edit(repo, files, f"hook {i}")
        t = time.perf_counter()
        peers.git_commit(repo, f"hook {i}")
        t_git = time.perf_counter() - t
        if i >= WARMUP:
            post.append(t_post)
            pre.append(t_pre)
            git.append(t_git)
    post_s, pre_s, git_s = stat(post), stat(pre), stat(git)
    ok = post_s.median <= 80 and post_s.p90 <= 120 and pre_s.median <= 60
    return Case("hook", "the whole `worldline hook claude-code` process: PostToolUse after a"
                        " 3-file edit (record + checkpoint with the transcript's new entries)",
                post_s, {"PreToolUse for a local call (whole process)": pre_s,
                         "git add -A && git commit per tool call": git_s},
                round(post_s.median / git_s.median, 4), "post / git",
                "post median ≤ 80 ms, p90 ≤ 120 ms; pre median ≤ 60 ms", ok)
