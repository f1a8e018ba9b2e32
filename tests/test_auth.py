"""Who may call: TCP needs TLS and a bearer token; other uids reach a Unix-socket
daemon only when allowed, checked from the peer's credentials."""

from __future__ import annotations

import os
import socket
import subprocess

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from worldline.client import Client, Unauthenticated

from .conftest import WORLDLINE, DaemonProcess
from .fidelity import in_child_as


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def tls(tmp_path_factory):
    d = tmp_path_factory.mktemp("tls")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                    "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost",
                    "-keyout", str(d / "key.pem"), "-out", str(d / "cert.pem")],
                   check=True, capture_output=True)
    (d / "token").write_text("s3cret-token-for-the-tests\n")
    return d


def test_tcp_without_tls_and_token_refuses_to_start(tmp_path, tls):
    for extra in ([], ["--tls-cert", str(tls / "cert.pem"), "--tls-key", str(tls / "key.pem")],
                  ["--token-file", str(tls / "token")]):
        res = subprocess.run(WORLDLINE + ["daemon", "--root", str(tmp_path / "r"), "--listen",
                                          f"localhost:{free_port()}", *extra],
                             capture_output=True, text=True, timeout=30)
        assert res.returncode != 0 and "TLS and a bearer token" in res.stderr


def test_tcp_with_tls_and_token(tmp_path, tls):
    port = free_port()
    address = f"localhost:{port}"
    d = DaemonProcess(tmp_path / "root", extra=[
        "--listen", address, "--tls-cert", str(tls / "cert.pem"), "--tls-key",
        str(tls / "key.pem"), "--token-file", str(tls / "token")])
    d.address = address
    d.start(wait=False)
    try:
        creds = grpc.ssl_channel_credentials((tls / "cert.pem").read_bytes())
        import time
        deadline = time.monotonic() + 20
        while True:  # health answers without a token
            try:
                with grpc.secure_channel(address, creds) as ch:
                    status = health_pb2_grpc.HealthStub(ch).Check(
                        health_pb2.HealthCheckRequest(), timeout=2).status
                    if status == health_pb2.HealthCheckResponse.SERVING:
                        break
            except grpc.RpcError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        ca = str(tls / "cert.pem")
        with Client(address, token="s3cret-token-for-the-tests", tls_ca=ca) as c:
            ws = tmp_path / "ws"
            ws.mkdir()
            c.create_session(str(ws))
            assert len(c.list_sessions()) == 1
        for token in ("wrong-token-of-enough-length", None):
            env_token = os.environ.pop("WORLDLINE_TOKEN", None)
            try:
                with Client(address, token=token, tls_ca=ca) as c:
                    with pytest.raises(Unauthenticated):
                        c.list_sessions()
            finally:
                if env_token:
                    os.environ["WORLDLINE_TOKEN"] = env_token
    finally:
        d.stop()


def connect_as(uid: int, socket_path: str) -> str:
    """In a child running as ``uid``: open the socket and speak the HTTP/2 preface.
    gRPC answers an admitted connection with its SETTINGS frame; a refused one is
    closed before anything comes back."""
    def connect():  # no grpc in the child: only a raw socket
        try:
            with socket.socket(socket.AF_UNIX) as s:
                s.settimeout(5)
                s.connect(socket_path)
                empty_settings = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
                s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + empty_settings)
                return "admitted" if s.recv(64) else "refused"
        except OSError as exc:
            return f"refused {exc.__class__.__name__}"
    return in_child_as(uid, connect)


@pytest.mark.skipif(os.geteuid() != 0, reason="switching uids needs root")
def test_only_allowed_uids_reach_the_shared_socket():
    import shutil
    import tempfile
    from pathlib import Path
    base = Path(tempfile.mkdtemp(prefix="wl-uid-"))
    os.chmod(base, 0o711)  # others may traverse to the socket, not list
    d = DaemonProcess(base / "root", extra=["--allow-uid", "4242"]).start()
    private = str(base / "root" / "worldline.sock")
    try:
        assert connect_as(4242, private + ".shared") == "admitted"
        assert connect_as(65534, private + ".shared").startswith("refused")
        assert connect_as(4242, private).startswith("refused")  # the private socket: owner only
        with d.client() as c:
            c.list_sessions()
        assert "refused a connection from uid 65534" in d.log.read_text()
        assert oct(os.stat(base / "root" / "meta.db").st_mode & 0o777) == oct(0o600)
    finally:
        d.stop()
        shutil.rmtree(base, ignore_errors=True)
