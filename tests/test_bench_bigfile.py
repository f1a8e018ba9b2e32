"""The bigfile and encrypted cases' own pieces (tests/bench/bigfile.py, encrypted.py):
the edits they make are the edits they say, and the canary search finds a canary in
any file below a data root and nothing else."""

from __future__ import annotations

import random

from .bench.bigfile import change_byte, insert_middle
from .bench.encrypted import found


def test_an_insertion_in_the_middle_shifts_the_second_half_by_its_length(tmp_path):
    data = random.Random(1).randbytes(10_007)  # the move's blocks do not divide it
    path = tmp_path / "big"
    path.write_bytes(data)
    insert_middle(path, b"I" * 4096, block=1000)
    assert path.read_bytes() == data[:5003] + b"I" * 4096 + data[5003:]


def test_a_one_byte_change_changes_one_byte(tmp_path):
    data = random.Random(2).randbytes(4096)
    path = tmp_path / "big"
    path.write_bytes(data)
    rng = random.Random(3)
    for _ in range(50):  # a byte's new value is never its old one
        before = path.read_bytes()
        change_byte(path, rng)
        after = path.read_bytes()
        assert len(after) == len(before)
        assert sum(a != b for a, b in zip(before, after, strict=True)) == 1


def test_the_canary_search_names_each_file_holding_a_canary(tmp_path):
    (tmp_path / "blobs" / "ab").mkdir(parents=True)
    (tmp_path / "blobs" / "ab" / "cd").write_bytes(b"\0" * 100 + b"wlcanaryAAA" + b"\1")
    (tmp_path / "meta.db-wal").write_bytes(b"x wlcanaryBBB y wlcanaryAAA")
    (tmp_path / "meta.db").write_bytes(b"wlcanaryCC")  # a prefix of a canary is not it
    hits = found(tmp_path, {"file content": "wlcanaryAAA", "conversation": "wlcanaryBBB",
                            "state": "wlcanaryCCC"})
    assert {k: sorted(v) for k, v in hits.items()} == {
        "file content": ["blobs/ab/cd", "meta.db-wal"], "conversation": ["meta.db-wal"]}
