"""Hypothesis fuzzing of every RPC: whatever the fields hold, the answer is a clear
status (never INTERNAL or UNKNOWN), nothing lands outside the sandbox, and the
daemon keeps serving."""

from __future__ import annotations

import os

import grpc
import pytest
from google.protobuf.descriptor import FieldDescriptor
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from worldline.v1 import worldline_pb2 as pb
from worldline.v1 import worldline_pb2_grpc as pb_grpc

from .conftest import tree_state

ALLOWED = {grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND,
           grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.ALREADY_EXISTS,
           grpc.StatusCode.ABORTED, grpc.StatusCode.RESOURCE_EXHAUSTED}
SERVICES = [pb.DESCRIPTOR.services_by_name[name] for name in ("Worldline", "Graphs")]


@pytest.fixture(scope="module")
def sandbox(daemon, tmp_path_factory):
    base = tmp_path_factory.mktemp("fuzz")
    ws = base / "ws"
    (ws / "sub").mkdir(parents=True)
    (ws / "sub" / "f.txt").write_text("fuzz\n")
    outside = base / "outside"
    outside.mkdir()
    (outside / "canary").write_text("untouched\n")
    os.symlink(outside, ws / "escape")
    with daemon.client() as c:
        s = c.create_session(str(ws))
        cp = s.checkpoint(messages=[{"role": "user", "content": "x"}])
        s.set_task("t", "pending")
        a = s.request_approval("deploy")
    return {"base": base, "ws": ws, "outside": outside, "ids": [s.id, cp.id, a.id],
            "before": tree_state(outside)}


def text_values(sandbox) -> st.SearchStrategy:
    ws, outside = str(sandbox["ws"]), str(sandbox["outside"])
    return st.one_of(
        st.sampled_from(sandbox["ids"]),
        st.sampled_from(["", "..", "../../etc", "/", "/etc", "/proc/self", "relative/path",
                         ws, str(sandbox["ws"] / "escape"), outside, ws + "/../outside",
                         "01M80E3YBRW3TTNZTARQ5GTRV8", "{}", "[]", "{\"role\": 1}",
                         "[{\"role\": \"user\"}]", "null", "\u0000", "x" * 70000,
                         "pending", "completed", "external_non_idempotent", "bash"]),
        st.text(max_size=40),
    )


def request_strategy(message, sandbox) -> st.SearchStrategy:
    fields = {}
    for f in message.fields:
        if f.message_type is not None:
            continue
        if f.type == FieldDescriptor.TYPE_STRING:
            base = text_values(sandbox)
        elif f.type == FieldDescriptor.TYPE_BOOL:
            base = st.booleans()
        elif f.type == FieldDescriptor.TYPE_DOUBLE:
            base = st.floats(min_value=-5, max_value=1, allow_nan=False)  # waits stay short
        else:
            base = st.integers(min_value=-5, max_value=10)
        if f.is_repeated:
            base = st.lists(base, max_size=3)
        fields[f.name] = base
    return st.fixed_dictionaries(fields)


@pytest.mark.parametrize("service,method", [(s.name, m.name) for s in SERVICES
                                            for m in s.methods])
def test_every_rpc_answers_clearly(daemon, sandbox, service, method):
    md = pb.DESCRIPTOR.services_by_name[service].methods_by_name[method]
    request_cls = getattr(pb, md.input_type.name)
    stub_cls = getattr(pb_grpc, f"{service}Stub")

    @settings(max_examples=25, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
    @given(request_strategy(md.input_type, sandbox))
    def check(values):
        request = request_cls(**values)
        with grpc.insecure_channel(daemon.address) as ch:
            stub = stub_cls(ch)
            try:
                getattr(stub, method)(request, timeout=30)
            except grpc.RpcError as exc:
                assert exc.code() in ALLOWED, (method, values, exc.code(), exc.details())

    check()
    assert tree_state(sandbox["outside"]) == sandbox["before"]
    with daemon.client() as c:
        c.list_sessions()  # still serving


hexish = st.lists(st.one_of(
    st.binary(max_size=40),
    st.text(alphabet="0123456789abcdef", min_size=30, max_size=140).map(str.encode),
    st.text(alphabet="0123456789abcdefABCDEF\"[],", max_size=80).map(str.encode),
), max_size=8).map(b"".join)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(hexish, hexish)
def test_pack_codecs_round_trip(a, b):
    """The pack's encodings give back exactly the bytes they were given."""
    from worldline.daemon.storage.packs import (
        DELTA,
        apply_copies,
        apply_copies_row,
        apply_delta,
        best_delta,
        compress,
        copy_delta,
        decompress,
        encode_delta,
        pack_hex,
        quick_delta,
        unpack_hex,
        zstd_apply,
        zstd_delta,
        zstd_whole,
    )
    assert unpack_hex(pack_hex(b)) == b
    assert zstd_apply(a, zstd_delta(a, b), len(b)) == b
    assert zstd_apply(a, zstd_delta(a, a + b + a, 19), len(a + b + a)) == a + b + a
    assert zstd_apply(None, zstd_whole(b), len(b)) == b
    for new in (b, a + b, a[:len(a) // 2] + b + a[len(a) // 2:]):
        kind, delta = best_delta(a, new)
        assert (apply_delta(a, delta) if kind == DELTA else zstd_apply(a, delta, len(new))) == new
    for new in (b, a + b, b + a, a[:len(a) // 2] + b + a[len(a) // 2:], a + a):
        assert apply_copies(a, copy_delta(a, new), len(new)) == new
        kind, delta = quick_delta(a, new)
        assert (apply_delta(a, delta) if kind == DELTA
                else apply_copies_row(a, delta, len(new))) == new
    assert decompress(compress(b)) == b
    assert apply_delta(a, encode_delta(a, b)) == b
    assert apply_delta(a, encode_delta(a, a + b)) == a + b


edits = st.lists(st.tuples(st.integers(0, 1 << 16), st.integers(0, 300), hexish), max_size=6)


@settings(max_examples=400, deadline=None, derandomize=True)
@given(hexish, edits, st.binary(max_size=48))
def test_copy_delta_in_c_is_the_python_codec(base, changes, garbage):
    """The C copy/insert delta (daemon/_codec.c) is byte for byte the Python twin's,
    on versions made by edits, moves and repeats of a base; and its decoder takes and
    refuses exactly what the twin's does."""
    from worldline.daemon.storage import packs
    try:
        from worldline.daemon._codec import apply_copies, copy_delta
    except ImportError:
        pytest.fail("worldline.daemon._codec was not built: install gcc and the Python"
                    " headers, then `make install`")
    base = base * 3  # long enough to hold blocks worth copying
    new = base
    for at, cut, text in changes:
        at %= len(new) + 1
        new = new[:at] + text + new[at + cut:]
    for data in (new, new[len(new) // 2:] + new[:len(new) // 2], new + base[:100] + new):
        delta = packs.copy_delta_python(base, data)
        assert copy_delta(base, data) == delta
        assert apply_copies(base, delta, len(data)) == data
        for candidate, size in ((delta, len(data) + 1), (delta, max(len(data) - 1, 0)),
                                (delta[:-1], len(data)), (delta + garbage, len(data)),
                                (garbage, len(data)), (garbage, len(garbage))):
            try:
                expected = packs.apply_copies_python(base, candidate, size)
            except ValueError as exc:
                with pytest.raises(ValueError, match=str(exc)):
                    apply_copies(base, candidate, size)
            else:
                assert apply_copies(base, candidate, size) == expected


@settings(max_examples=400, deadline=None, derandomize=True)
@given(hexish, st.binary(max_size=64))
def test_hex_packing_in_c_is_the_python_codec(data, garbage):
    """The C hex packing (daemon/_codec.c) is byte for byte the Python twin's, on
    what it packs and on what it refuses to unpack."""
    from worldline.daemon.storage import packs
    try:
        from worldline.daemon._codec import pack_hex, unpack_hex
    except ImportError:
        pytest.fail("worldline.daemon._codec was not built: install gcc and the Python"
                    " headers, then `make install`")
    packed = packs.pack_hex_python(data)
    assert pack_hex(data) == packed
    assert unpack_hex(packed) == data
    for candidate in (garbage, packed[:-1], packed + garbage):
        try:
            expected = packs.unpack_hex_python(candidate)
        except ValueError as exc:
            with pytest.raises(ValueError, match=str(exc)):
                unpack_hex(candidate)
        else:
            assert unpack_hex(candidate) == expected


@settings(max_examples=400, deadline=None, derandomize=True)
@given(st.binary(max_size=40), st.binary(max_size=40), st.binary(max_size=40),
       st.binary(max_size=40), st.integers(min_value=0, max_value=3))
def test_shared_ends_in_c_are_the_python_twins(head, old, new, tail, repeat):
    """The splice's two ends in C are the Python twin's, on edits anywhere: at either
    end, in the middle, overlapping ends (one text the other's prefix and suffix at
    once), and lengths on both sides of the word the C compares at a time."""
    from worldline.daemon.storage import packs
    try:
        from worldline.daemon._codec import shared_ends
    except ImportError:
        pytest.fail("worldline.daemon._codec was not built: install gcc and the Python"
                    " headers, then `make install`")
    head, tail = head * (repeat * 7 + 1), tail * (repeat * 5 + 1)
    base, data = head + old + tail, head + new + tail
    for x, y in ((base, data), (data, base), (base, base), (head, head + tail),
                 (head + tail, tail), (b"", data), (base, b"")):
        assert shared_ends(x, y) == packs.shared_ends_python(x, y)
        prefix, suffix = shared_ends(x, y)
        assert prefix + suffix <= min(len(x), len(y))
        assert x[:prefix] == y[:prefix] and x[len(x) - suffix:] == y[len(y) - suffix:]


names = st.one_of(
    st.text(min_size=1, max_size=30),
    st.binary(min_size=1, max_size=30).map(os.fsdecode),  # not UTF-8: lone surrogates
    st.sampled_from(['a"b', "back\\slash", "tab\there", "nl\nx", "\x7f\x00\x1f", "\U0001f600"]),
)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.dictionaries(names, st.tuples(
    st.sampled_from(["file", "symlink", "dir", "whiteout", "opaque"]),
    st.integers(min_value=0, max_value=0o7777),
    st.one_of(st.text(max_size=80), st.text(alphabet="0123456789abcdef", min_size=64,
                                             max_size=64)),
    st.integers(min_value=0, max_value=1 << 70),
    # owner, group, time (ns, before 1970 too) and extras; no owner: a tree of 0.3
    st.one_of(st.just(()), st.tuples(
        st.integers(min_value=0, max_value=(1 << 32) - 1),
        st.integers(min_value=0, max_value=(1 << 32) - 1),
        st.one_of(st.integers(min_value=-(1 << 63), max_value=(1 << 63) - 1),
                  st.sampled_from([-(1 << 63), (1 << 63) - 1, -1, 0, 1 << 64,
                                   -(1 << 64)])),
        st.one_of(st.just(""), st.text(max_size=40))))).map(
            lambda r: r[:4] + r[4]), max_size=12))
def test_tree_encoding_in_c_is_the_python_encoding(rows):
    """Trees are content-addressed: the C encoder (daemon/_codec.c) must write exactly
    the bytes json.dumps writes, or one folder would get two digests."""
    from worldline.daemon.capture import trees
    from worldline.daemon.capture.trees import Entry
    try:
        from worldline.daemon._codec import encode_tree
    except ImportError:
        pytest.fail("worldline.daemon._codec was not built: install gcc and the Python"
                    " headers, then `make install`")
    tree = {name: Entry(*fields) for name, fields in rows.items()}
    assert encode_tree(sorted(tree.items()), trees._CODES) == trees.encode_python(tree)
    assert trees.encode(tree) == trees.encode_python(tree)
