"""The operators' console in a real browser (Debian's chromium, driven headless by
Playwright) against a real daemon and a real `worldline console` process.

Screenshots of the pages go to $WORLDLINE_SCREENSHOTS when it is set (the README's
come from here: `WORLDLINE_SCREENSHOTS=docs/img make test PYTEST_ARGS=tests/test_console.py`).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from .conftest import WORLDLINE, DaemonProcess, unmount_below
from .fidelity import AGENT_UID
from .test_agent_users import place  # noqa: F401  (a fixture)
from .test_hooks import Agent, decision, finish

CHROMIUM = shutil.which("chromium")
SHOTS = os.environ.get("WORLDLINE_SCREENSHOTS")


class Console:
    """A `worldline console` process as a user runs it; its URL from its first line."""

    def __init__(self, address: str, log: Path, uid: int | None = None) -> None:
        prefix = [] if uid is None else ["setpriv", f"--reuid={uid}", f"--regid={uid}",
                                         "--clear-groups"]
        self.log = log
        with open(log, "ab") as err:
            self.proc = subprocess.Popen([*prefix, *WORLDLINE, "--address", address,
                                          "console"], stdout=subprocess.PIPE, stderr=err,
                                         text=True, cwd="/")
        self.url = self.proc.stdout.readline().strip()
        assert self.url.startswith("http://127.0.0.1:"), log.read_text()
        parts = urllib.parse.urlsplit(self.url)
        self.base = f"{parts.scheme}://{parts.netloc}"
        self.token = urllib.parse.parse_qs(parts.query)["token"][0]

    def get(self, path: str, token: bool = True) -> tuple[int, str]:
        request = urllib.request.Request(self.base + path)
        if token:
            request.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(request, timeout=30) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=20)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A daemon with a session of four tool calls, a restore and a fork, and hostile
    names and messages, and its console."""
    base = tmp_path_factory.mktemp("console")
    d = DaemonProcess(base / "root").start()
    ws = base / "ws"
    ws.mkdir()
    with d.client() as c:
        s = c.create_session(str(ws), name="fix-the-parser")
        marks = []
        for i, (tool, args) in enumerate([
                ("Write", {"file_path": str(ws / "parser.py")}),
                ("Bash", {"command": "pytest -q tests/test_parser.py"}),
                ("Edit", {"file_path": str(ws / "parser.py")}),
                ("Bash", {"command": "git push origin main"})]):
            (ws / "parser.py").write_text("".join(f"line {j} v{i}\n" for j in range(30)))
            c.record_tool_call(s.id, tool, args)
            marks.append(c.checkpoint(s.id, label=f"after {tool}", messages=[
                {"role": "user", "content": f"step {i} <script>alert('m{i}')</script>"},
                {"role": "assistant", "content": [
                    {"type": "tool_use", "name": tool, "input": args}]}]))
        (ws / "<img src=x onerror=alert(1)>").write_text("<b>bold</b>\n")
        hostile = c.checkpoint(s.id, label="<svg onload=alert(2)>")
        c.restore(s.id, marks[1].id, acknowledge_side_effects=True)
        fork = c.fork(marks[0].id, name="other-approach")
        (Path(fork.workspace) / "parser.py").write_text("a different parser\n")
        fork_cp = c.checkpoint(fork.id, label="rewrote it")
    console = Console(d.address, base / "console.log")
    yield {"daemon": d, "session": s, "marks": marks, "hostile": hostile, "fork": fork,
           "fork_cp": fork_cp, "console": console, "ws": ws}
    console.stop()
    d.stop()
    unmount_below(base)  # the fork's view


@pytest.fixture(scope="module")
def browser():
    assert CHROMIUM, "chromium is not installed: run `make browser` (deploy/ensure-browser.sh)"
    from playwright.sync_api import sync_playwright
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield b
        b.close()


@pytest.fixture
def page(browser, world):
    """A page logged in with the printed URL; every dialog and console message kept."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.dialogs, page.messages = [], []
    page.on("dialog", lambda d: (page.dialogs.append(d.message), d.dismiss()))
    page.on("console", lambda m: page.messages.append(m.text))
    page.goto(world["console"].url)
    yield page
    context.close()


def shot(page, name: str) -> None:
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(SHOTS) / f"console-{name}.png"), full_page=False)


def test_without_the_token_nothing_is_shown(world):
    console = world["console"]
    assert console.get("/", token=False)[0] == 401
    assert console.get("/?token=not-the-token", token=False)[0] == 401
    assert console.get(f"/s/{world['session'].id}", token=False)[0] == 401
    request = urllib.request.Request(f"{console.base}/?token={console.token}")

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *a, **k):
            return None
    try:
        urllib.request.build_opener(NoRedirect).open(request, timeout=30)
        raise AssertionError("the token's first use redirects")
    except urllib.error.HTTPError as exc:
        assert exc.code == 303
        assert exc.headers["Location"] == "/"
        cookie = exc.headers["Set-Cookie"]
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie.replace("Strict", "strict")
        csp = exc.headers["Content-Security-Policy"]
        assert "script-src 'self'" in csp and "unsafe-inline" not in csp


def test_the_tokens_redirect_stays_on_the_console_and_keeps_the_query(world):
    """The first use of the token redirects to the same page of this console: a path
    that starts `//` is no other site's, and the query's values come back encoded."""
    import http.client
    console = world["console"]
    host, port = urllib.parse.urlsplit(console.base).netloc.split(":")
    for target, location in [
            (f"//evil.example/x?token={console.token}", "/evil.example/x"),
            (f"/%2F%2Fevil.example?token={console.token}", "/evil.example"),
            (f"/diff?a=1%262%3D3&token={console.token}&b=%25", "/diff?a=1%262%3D3&b=%25")]:
        conn = http.client.HTTPConnection(host, int(port), timeout=30)
        conn.request("GET", target)
        r = conn.getresponse()
        r.read()
        conn.close()
        assert (r.status, r.getheader("Location")) == (303, location), target


def test_another_user_of_the_machine_with_the_token_is_refused(world):
    """A browser sends 127.0.0.1's cookie to any port of it, an agent's server's too: a
    connection whose socket is another user's is refused, token or cookie."""
    from .fidelity import in_child_as
    console = world["console"]
    assert console.get("/")[0] == 200  # root's, as the console's user's

    def get() -> int:
        request = urllib.request.Request(console.base + "/",
                                         headers={"Authorization": f"Bearer {console.token}"})
        try:
            with urllib.request.urlopen(request, timeout=30) as r:
                return r.status
        except urllib.error.HTTPError as exc:
            return exc.code
    assert in_child_as(AGENT_UID, get) == 403


def test_a_csp_report_is_read_only_up_to_its_bound(world):
    """/csp-report takes no token: a report past 64 KiB is refused, not read whole."""
    console = world["console"]

    def post(body: bytes) -> int:
        request = urllib.request.Request(console.base + "/csp-report", data=body,
                                         method="POST",
                                         headers={"Content-Type": "application/csp-report"})
        try:
            with urllib.request.urlopen(request, timeout=30) as r:
                return r.status
        except urllib.error.HTTPError as exc:
            return exc.code
        except (urllib.error.URLError, ConnectionError) as exc:  # answered before it all
            assert isinstance(getattr(exc, "reason", exc), ConnectionError), exc
            return 413  # was sent: the 413 came first and the connection closed
    assert post(b'{"csp-report": {}}') == 204
    assert post(b"x" * (1 << 20)) == 413


def test_the_sessions_page_lists_and_filters(page, world):
    names = page.locator("#sessions tbody tr").all_inner_texts()
    assert any("fix-the-parser" in n for n in names) and any("other-approach" in n
                                                             for n in names)
    page.fill("#search", "other-appr")
    page.press("#search", "Enter")
    page.wait_for_load_state()
    rows = page.locator("#sessions tbody tr").all_inner_texts()
    assert len(rows) == 1 and "other-approach" in rows[0]
    shot(page, "sessions")


def test_the_timeline_draws_tool_calls_restores_and_forks(page, world):
    s = world["session"]
    page.goto(f"{world['console'].base}/s/{s.id}")
    nodes = page.locator("svg.timeline a.node")
    assert nodes.count() == 7  # initial, four calls, the hostile one, the restore
    titles = page.locator("svg.timeline text.title").all_text_contents()
    assert titles[0].startswith("↺ restored to #2")
    assert any(t.startswith("Bash pytest -q tests/test_parser.py") for t in titles)
    assert any("⚠" in t and "git push origin main" in t for t in titles)  # a side effect
    assert page.locator("svg.timeline path.edge-restore").count() == 1
    fork_link = page.locator("svg.timeline a.fork")
    assert fork_link.count() == 1 and "other-approach" in fork_link.text_content()
    assert page.locator("svg.timeline path.edge-fork").count() == 1
    fork_link.click()  # the fork's own timeline draws where it came from
    page.wait_for_url(f"**/s/{world['fork'].id}")
    origin = page.locator("svg.timeline a.fork")
    assert origin.text_content() == f"from #1 of {s.id[:10]}…"
    assert page.locator("svg.timeline path.edge-fork").count() == 1
    page.goto(f"{world['console'].base}/s/{s.id}")
    shot(page, "timeline")
    page.keyboard.press("j")
    page.keyboard.press("j")
    page.keyboard.press("Enter")
    page.wait_for_url("**/c/*")
    assert "Checkpoint #" in page.locator("h1").inner_text()


def test_a_node_opens_the_world_as_of_it(page, world):
    cp = world["marks"][2]
    page.goto(f"{world['console'].base}/c/{cp.id}")
    convo = page.locator("ol.conversation li")
    assert convo.count() == 6  # three steps of two messages each
    assert "step 2 <script>alert('m2')</script>" in convo.nth(4).inner_text()
    assert "Edit" in convo.nth(5).inner_text()
    assert page.locator("ul.files li").all_inner_texts() == ["~ parser.py"]


def test_a_paths_history_names_each_checkpoint_and_call_that_changed_it(page, world):
    s = world["session"]
    page.goto(f"{world['console'].base}/c/{world['marks'][2].id}")
    page.click("ul.files a")  # parser.py, from the files the checkpoint changed
    # four calls wrote it, and the restore wrote it back
    assert "5 checkpoint(s) changed parser.py" in page.locator("#path-summary").inner_text()
    sections = page.locator("section.file")
    assert [h.split(" in ")[0] for h in sections.locator("h3").all_inner_texts()] == [
        "MODIFIED", "MODIFIED", "MODIFIED", "MODIFIED", "ADDED"]
    assert "+line 0 v1" in sections.nth(0).locator("pre.patch .add").all_inner_texts()
    assert "Bash git push origin main" in sections.nth(1).inner_text()
    assert "+line 0 v3" in sections.nth(1).locator("pre.patch .add").all_inner_texts()
    with world["daemon"].client() as c:
        want = [ch.checkpoint.id for ch in c.path_history(s.id, "parser.py")]
    links = sections.locator("h3 a").evaluate_all("els => els.map(e => e.getAttribute('href'))")
    assert links == [f"/c/{cid}" for cid in want]


def test_a_diff_across_two_forks(page, world):
    a, b = world["marks"][1], world["fork_cp"]
    page.goto(f"{world['console'].base}/diff?from={a.id}&to={b.id}")
    assert "1 added, 1 modified, 0 deleted" in page.locator("#diff-summary").inner_text() or \
        "0 added, 1 modified, 0 deleted" in page.locator("#diff-summary").inner_text()
    section = page.locator("section.file.modified")
    assert "parser.py" in section.locator("h3").inner_text()
    assert "+a different parser" in section.locator("pre.patch .add").all_inner_texts()
    assert "-line 0 v1" in section.locator("pre.patch .del").all_inner_texts()
    shot(page, "diff")


def test_a_diff_shows_a_change_of_mode_and_a_binary_file(page, world, tmp_path):
    ws = tmp_path / "meta"
    ws.mkdir()
    (ws / "run.sh").write_text("echo hi\n")
    (ws / "blob.bin").write_bytes(b"\0\1\2" * 100)
    with world["daemon"].client() as c:
        s = c.create_session(str(ws))
        a = c.checkpoint(s.id)
        (ws / "run.sh").chmod(0o755)
        (ws / "blob.bin").write_bytes(b"\0\3\2" * 100)
        b = c.checkpoint(s.id)
    page.goto(f"{world['console'].base}/diff?from={a.id}&to={b.id}")
    run = page.locator("section.file", has_text="run.sh")
    assert run.locator("pre.patch .meta").all_inner_texts()[1:] == [
        "old mode 644", "new mode 755"]
    blob = page.locator("section.file", has_text="blob.bin")
    assert "binary file: its bytes differ" in blob.inner_text()


def test_agent_text_is_shown_as_text_and_never_runs(page, world):
    base = world["console"].base
    hostile = world["hostile"]
    for path in (f"/c/{hostile.id}", f"/s/{world['session'].id}",
                 f"/diff?from={world['marks'][3].id}&to={hostile.id}", "/audit"):
        page.goto(base + path)
        page.wait_for_load_state("networkidle")
    page.goto(f"{base}/c/{hostile.id}")
    assert page.get_by_text("<img src=x onerror=alert(1)>").count() >= 1
    assert page.get_by_text("<svg onload=alert(2)>").count() >= 1
    assert page.locator("img[src=x]").count() == 0
    page.goto(f"{base}/c/{world['marks'][0].id}")
    assert page.get_by_text("step 0 <script>alert('m0')</script>").count() == 1
    assert page.dialogs == []
    assert not [m for m in page.messages if "Content Security Policy" in m or
                "Refused to" in m], page.messages


def test_a_change_without_the_csrf_token_is_refused(page, world):
    console = world["console"]
    s = world["session"]
    with world["daemon"].client() as c:
        a = c.request_approval(s.id, "deploy", {"env": "staging"})
    status = page.evaluate("""async ([url]) => {
        const body = new URLSearchParams({decision: "approve"});
        return (await fetch(url, {method: "POST", body})).status; }""",
                           [f"/approvals/{a.id}/decide"])
    assert status == 403
    request = urllib.request.Request(
        f"{console.base}/approvals/{a.id}/decide", method="POST",
        data=urllib.parse.urlencode({"decision": "approve", "csrf": "x"}).encode(),
        headers={"Authorization": f"Bearer {console.token}"})
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(request, timeout=30)
    assert err.value.code == 403
    with world["daemon"].client() as c:
        assert c.get_approval(a.id).status == "pending"
        c.decide_approval(a.id, approve=False, reason="test over")


def test_a_restore_from_the_console_previews_then_equals_the_clis(page, world, tmp_path):
    d = world["daemon"]
    with d.client() as c:
        ws = tmp_path / "restore-ws"
        ws.mkdir()
        (ws / "keep.txt").write_text("one\n")
        s = c.create_session(str(ws), name="restore-me")
        first = c.checkpoint(s.id, label="first")
        (ws / "keep.txt").write_text("two\n")
        (ws / "new.txt").write_text("new\n")
        c.record_tool_call(s.id, "Bash", {"command": "git push"})
        c.checkpoint(s.id, label="second")
    (ws / "unsaved.txt").write_text("not checkpointed\n")
    preview = d.cli_json("restore", s.id, first.id, "--dry-run", "--yes")
    page.goto(f"{world['console'].base}/c/{first.id}")
    page.click("text=Restore restore-me to this…")
    assert sorted(page.locator("#would-write li").all_inner_texts()) == \
        sorted(preview["files_written"])
    assert sorted(page.locator("#would-remove li").all_inner_texts()) == \
        sorted(preview["files_removed"])
    assert "git push" in page.locator("ul.side-effects").inner_text()
    assert page.locator("#not-checkpointed li").all_inner_texts() == ["unsaved.txt"]
    assert (ws / "new.txt").exists()  # the preview changed nothing
    page.click("#restore-confirm")  # refused by the browser until acknowledged
    assert "/s/" in page.url and (ws / "new.txt").exists()
    page.check("#acknowledge")
    page.click("#restore-confirm")
    page.wait_for_url("**/op/*")
    shot(page, "restore-progress")
    page.wait_for_selector("#restore-done", timeout=30000)
    assert sorted(page.locator("#written li").all_inner_texts()) == sorted(
        preview["files_written"])
    assert sorted(page.locator("#removed li").all_inner_texts()) == sorted(
        preview["files_removed"])
    assert not (ws / "new.txt").exists() and (ws / "keep.txt").read_text() == "one\n"
    log = d.cli_json("log", s.id)
    assert log[-1]["kind"] == "restore" and log[-1]["restored_from"] == first.id
    assert page.locator("#new-head").inner_text() == log[-1]["id"]
    assert log[-2]["label"] == "before restore"  # the unsaved edit, kept
    assert page.locator("#before a").get_attribute("href") == f"/c/{log[-2]['id']}"


def test_an_approval_decided_in_the_console_releases_the_waiting_request_and_hook(
        page, world, tmp_path):
    d = world["daemon"]
    s = world["session"]
    page.goto(f"{world['console'].base}/approvals")
    waiting = subprocess.Popen([*WORLDLINE, "--address", d.address, "--json", "approval",
                                "request", s.id, "deploy", "--args", '{"env": "prod"}',
                                "--wait", "60"], stdout=subprocess.PIPE, text=True)
    row = page.locator("#pending tbody tr", has_text="deploy")
    row.wait_for(timeout=15000)  # it arrives live: the page is not reloaded
    assert '"env": "prod"' in row.inner_text()
    shot(page, "approvals")
    row.get_by_role("button", name="Approve").click()
    assert waiting.wait(timeout=30) == 0
    assert json.loads(waiting.stdout.read())["status"] == "approved"

    ws = tmp_path / "hook-ws"
    ws.mkdir()
    agent = Agent("claude-code", d, ws, tmp_path, ["--approval", "wait", "--wait", "60"])
    agent.run("start")
    proc = agent.popen("pre_push")
    page.goto(f"{world['console'].base}/approvals")
    row = page.locator("#pending tbody tr", has_text="Bash")
    row.wait_for(timeout=20000)
    row.get_by_role("button", name="Approve").click()
    assert decision("claude-code", finish(proc)) == "allow"


def test_an_agent_users_console_lists_only_its_own_sessions(place, tmp_path):  # noqa: F811
    d, home, _ = place
    with d.client() as c:
        root_session = c.create_session(str(tmp_path), name="roots-own")
    out = subprocess.run(["setpriv", f"--reuid={AGENT_UID}", f"--regid={AGENT_UID}",
                          "--clear-groups", *WORLDLINE, "--address", d.address, "--json",
                          "session", "create", "--workspace", str(home / "ws"), "--name",
                          "agents-own"], capture_output=True, text=True, cwd="/", timeout=60)
    assert out.returncode == 0, out.stderr
    agent_session = json.loads(out.stdout)["id"]
    console = Console(d.address, tmp_path / "console.log", uid=AGENT_UID)
    try:
        status, html = console.get("/")
        assert status == 200
        assert agent_session in html and "agents-own" in html
        assert root_session.id not in html and "roots-own" not in html
        assert console.get(f"/s/{root_session.id}")[0] in (403, 404)
    finally:
        console.stop()


def test_beyond_loopback_the_console_needs_tls():
    out = subprocess.run([*WORLDLINE, "console", "--listen", "0.0.0.0:0"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "TLS" in out.stderr
    assert out.stdout == ""


def test_the_pages_for_audit_storage_and_rates_answer(page, world):
    base = world["console"].base
    page.goto(f"{base}/audit")
    assert "The chain verifies" in page.locator("#verified").inner_text()
    page.goto(f"{base}/storage")
    assert page.locator("#storage tbody tr").count() >= 2
    page.goto(f"{base}/rates")
    row = page.locator("#rates-sessions tbody tr", has_text="fix-the-parser")
    assert row.locator("td").nth(2).inner_text() == "1"  # one restore


def test_a_long_timeline_is_paged_newest_first(page, world, tmp_path):
    from worldline.client.console.views import PAGE
    ws = tmp_path / "long"
    ws.mkdir()
    with world["daemon"].client() as c:
        s = c.create_session(str(ws), name="long-history")
        for i in range(PAGE + 20):
            c.record_tool_call(s.id, "Bash", {"command": f"echo {i}"})
            c.checkpoint(s.id)
    page.goto(f"{world['console'].base}/s/{s.id}")
    seqs = page.locator("svg.timeline text.seq").all_text_contents()
    assert len(seqs) == PAGE and seqs[0] == f"#{PAGE + 20}" and seqs[-1] == "#21"
    assert page.locator("svg.timeline text.title").first.text_content() == \
        f"Bash echo {PAGE + 19}"
    page.click("text=older")
    seqs = page.locator("svg.timeline text.seq").all_text_contents()
    assert seqs == [f"#{i}" for i in range(20, -1, -1)]
    assert page.locator("svg.timeline text.title").last.text_content() == "session created"


def test_the_daemon_serves_the_console_for_its_operators(tmp_path):
    url_file = tmp_path / "root" / "console.url"
    url_file.parent.mkdir()
    url_file.write_text("left from before\n")
    url_file.chmod(0o644)
    d = DaemonProcess(tmp_path / "root", extra=["--console", "127.0.0.1:0"]).start()
    try:
        deadline = time.monotonic() + 10
        while "token" not in url_file.read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert url_file.stat().st_mode & 0o777 == 0o600
        url = urllib.parse.urlsplit(url_file.read_text().strip())
        token = urllib.parse.parse_qs(url.query)["token"][0]
        assert token not in d.log.read_text()  # the log names the file, not the token
        request = urllib.request.Request(f"{url.scheme}://{url.netloc}/",
                                         headers={"Authorization": f"Bearer {token}"})
        with urllib.request.urlopen(request, timeout=30) as r:
            assert r.status == 200 and "Sessions" in r.read().decode()
    finally:
        d.stop()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"{url.scheme}://{url.netloc}/", timeout=5)
