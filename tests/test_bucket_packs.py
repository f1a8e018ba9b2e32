"""The bytes of a bucket's rewritten pack objects (bucket_packs.py): every entry reads
back exactly, deltas only from entries before them, and any damage is DataLoss."""

from __future__ import annotations

import hashlib
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from worldline.client.errors import DataLoss
from worldline.daemon.storage import bucket_packs, packs
from worldline.daemon.storage.bucket_packs import DELTA, MAX_CHAIN, ObjectReader, build


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _versions(n: int, seed: int = 1) -> list[bytes]:
    """``n`` versions of a text file, each a few edits of the one before."""
    rng = random.Random(seed)
    lines = [b"line %d of a module under edit, with some words\n" % i for i in range(300)]
    out = []
    for v in range(n):
        for _ in range(3):
            at = rng.randrange(len(lines))
            lines[at] = b"changed in version %d at %d\n" % (v, at)
        if v % 4 == 0:
            lines.insert(rng.randrange(len(lines)), b"a line added in version %d\n" % v)
        out.append(b"".join(lines))
    return out


def _read_all(body: bytes, entries) -> dict[str, bytes]:
    reader = ObjectReader(body, "test object")
    return bucket_packs.decode_all(
        reader, [(d, off, ln, codec, size) for d, off, ln, size, codec in entries])


def test_a_chain_of_versions_is_stored_as_deltas_and_reads_back():
    versions = _versions(40)
    blobs = {_digest(v): v for v in versions}
    order = list(blobs)
    bases = {d: order[i - 1] for i, d in enumerate(order) if i}
    body, entries = build(blobs, bases)
    assert _read_all(body, entries) == blobs
    codecs = [codec for *_, codec in entries]
    assert codecs[0] == "zstd" and set(codecs[1:]) == {DELTA}
    whole = sum(len(packs.zstd_whole(v, packs.SMALL)) for v in versions)
    assert len(body) < whole / 5  # what the versions share is stored once


def test_bases_come_first_whatever_order_the_blobs_are_given_in():
    versions = _versions(12)
    digests = [_digest(v) for v in versions]
    bases = {d: digests[i - 1] for i, d in enumerate(digests) if i}
    shuffled = dict(reversed(list(zip(digests, versions, strict=True))))
    body, entries = build(shuffled, bases)
    offsets = {d: off for d, off, *_ in entries}
    assert all(offsets[bases[d]] < offsets[d] for d in bases)
    assert _read_all(body, entries) == dict(zip(digests, versions, strict=True))


def test_a_suggested_cycle_or_a_base_not_in_the_object_is_stored_whole():
    a, b, c = (v for v in _versions(3))
    da, db, dc = _digest(a), _digest(b), _digest(c)
    body, entries = build({da: a, db: b, dc: c}, {da: db, db: da, dc: "f" * 64})
    got = {d: codec for d, *_, codec in entries}
    assert got[dc] != DELTA and sorted(got[d] for d in (da, db)) == [DELTA, "zstd"]
    assert _read_all(body, entries) == {da: a, db: b, dc: c}


def test_a_chain_is_cut_at_its_longest_and_reads_within_it():
    versions = _versions(MAX_CHAIN + 10, seed=3)
    digests = [_digest(v) for v in versions]
    body, entries = build(dict(zip(digests, versions, strict=True)),
                          {d: digests[i - 1] for i, d in enumerate(digests) if i})
    assert sum(codec != DELTA for *_, codec in entries) == 2  # one restart of the chain
    assert _read_all(body, entries) == dict(zip(digests, versions, strict=True))


def test_a_blob_that_gains_nothing_from_a_delta_is_stored_whole():
    noise, other = random.randbytes(5000), random.randbytes(5000)
    body, entries = build({_digest(noise): noise, _digest(other): other},
                          {_digest(other): _digest(noise)})
    assert {codec for *_, codec in entries} == {"raw"}
    assert len(body) == 10000


@settings(max_examples=40, deadline=None)
@given(st.lists(st.binary(max_size=3000), min_size=1, max_size=12, unique=True),
       st.randoms(use_true_random=False))
def test_any_blobs_and_any_suggestions_read_back_exactly(datas, rng):
    blobs = {_digest(d): d for d in datas}
    digests = list(blobs)
    bases = {d: rng.choice(digests) for d in digests if rng.random() < 0.8}
    body, entries = build(blobs, bases)
    assert _read_all(body, entries) == blobs


def _delta_entry():
    versions = _versions(3)
    digests = [_digest(v) for v in versions]
    body, entries = build(dict(zip(digests, versions, strict=True)),
                          {digests[1]: digests[0], digests[2]: digests[1]})
    last = next(e for e in entries if e[0] == digests[2])
    assert last[4] == DELTA
    return bytearray(body), entries, last


@pytest.mark.parametrize("damage", [
    "base-after", "base-digest", "base-codec", "kind", "cut-header", "payload", "base-bytes",
    "past-the-end"])
def test_a_damaged_delta_entry_is_data_loss(damage):
    body, entries, (digest, off, length, size, codec) = _delta_entry()
    if damage == "base-after":  # a delta whose base would be itself
        crafted = (bytes([packs.ZDELTA]) + bytes.fromhex(digest) + bytes([0])
                   + packs._varint(len(body)) + packs._varint(5) + packs._varint(5) + b"12345")
        off, length = len(body), len(crafted)
        body += crafted
    elif damage == "base-digest":
        body[off + 1] ^= 0xFF
    elif damage == "base-codec":
        body[off + 33] = 9
    elif damage == "kind":
        body[off] = 77
    elif damage == "cut-header":
        length = 20
    elif damage == "payload":
        body[off + length - 2] ^= 0x55
    elif damage == "base-bytes":  # the base's own bytes, which the header points at
        base_off = next(e[1] for e in entries if e[4] != DELTA)
        body[base_off + 10] ^= 0x55
    elif damage == "past-the-end":
        length = len(body) - off + 1
    with pytest.raises(DataLoss):
        bucket_packs.decode_all(ObjectReader(bytes(body), "damaged"),
                                [(digest, off, length, codec, size)])
