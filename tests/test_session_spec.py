"""The typed session spec (session_spec.py): the text the store keeps is read once and
written back in the same format, whatever keys it holds."""

from __future__ import annotations

import json
from dataclasses import replace

from worldline.daemon.owners import Agent
from worldline.daemon.session_spec import SessionSpec

# Specs as the daemon records them: a workspace only; with a container, its creation
# spec and the folder its binds name; an allowed user's, with --exclude patterns; a
# take-over under way; and one with a key this version does not name.
WRITTEN = [
    {"roots": {"workspace": [64769, 1234]}},
    {"roots": {"workspace": [64769, 1234], "container": [2049, 77]},
     "container": {"Config": {"Image": "busybox"}, "HostConfig": {"Binds": ["/w:/work"]}},
     "workspace": "/w"},
    {"roots": {"workspace": [1, 2]}, "exclude": ["*.log", "build/"], "agent": [1000, 1000]},
    {"roots": {"workspace": [1, 2]}, "workspace": "/old", "staging": [1, 9], "placed": [1, 9]},
    {"roots": {"workspace": [1, 2]}, "later": {"kept": True}},
]


def test_each_recorded_spec_reads_back_and_is_written_as_it_was():
    for raw in WRITTEN:
        text = json.dumps(raw, sort_keys=True)
        spec = SessionSpec.parse(text)
        assert spec.to_json() == text
        assert spec.root("workspace") == raw["roots"]["workspace"]
        assert spec.root("container") == raw["roots"].get("container")
        assert spec.patterns == raw.get("exclude", [])
        assert spec.container == raw.get("container")


def test_an_empty_or_missing_spec_is_the_daemon_owners_with_nothing_recorded():
    for text in ("", None, "{}"):
        spec = SessionSpec.parse(text)
        assert spec.roots is None and spec.owner is None and spec.patterns == []
        assert spec.as_dict() == {} and spec.to_json() == "{}"


def test_a_spec_is_changed_by_copy_never_in_place():
    text = json.dumps(WRITTEN[2], sort_keys=True)
    spec = SessionSpec.parse(text)
    assert spec.owner == Agent(1000, 1000)
    moved = replace(spec, roots={"workspace": [3, 4]})
    assert json.loads(moved.to_json())["roots"] == {"workspace": [3, 4]}
    assert SessionSpec.parse(text).root("workspace") == [1, 2]  # the parsed one unchanged
    assert SessionSpec.parse(text).to_json() == text
