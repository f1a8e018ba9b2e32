"""The console's web application: pages over the daemon's calls, as the calling user.

Every page is rendered on the server (Jinja2, escaped); the little script there is
(``static/console.js``) follows the pending approvals live and a restore's progress,
and adds keyboard shortcuts. The console holds no state of its own but the running
restores it started: the daemon is the record.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import threading
import time
import uuid
from pathlib import Path
from urllib.parse import quote, urlencode

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.requests import Request
from starlette.responses import (
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from ..errors import WorldlineError
from . import views
from .security import COOKIE, HEADERS, Keys, bearer, same_user

HERE = Path(__file__).resolve().parent  # the real folder (an editable install links files)
DIFF_PAGE = 50          # files on one page of a diff
SSE_POLL = 0.5          # seconds between two looks at the pending approvals
CSP_REPORT = 1 << 16    # bytes of one CSP report read, at most (the route takes no token)
_STATUS = {"NOT_FOUND": 404, "INVALID_ARGUMENT": 400, "PERMISSION_DENIED": 403,
           "FAILED_PRECONDITION": 409, "ALREADY_EXISTS": 409, "ABORTED": 409,
           "UNAUTHENTICATED": 401, "RESOURCE_EXHAUSTED": 429, "UNAVAILABLE": 503,
           "DEADLINE_EXCEEDED": 504}


class Console:
    """The pages, over one client of the daemon (``client_factory()`` makes it)."""

    def __init__(self, client, keys: Keys, secure: bool = False) -> None:
        self.client = client
        self.keys = keys
        self.secure = secure
        self.templates = Jinja2Templates(directory=str(HERE / "templates"))
        self.templates.env.autoescape = True
        self.templates.env.globals.update(csrf=keys.csrf, tool_summary=views.tool_summary)
        self.templates.env.filters["when"] = _when
        self.templates.env.filters["size"] = _size
        self.templates.env.filters["pretty"] = lambda v: json.dumps(
            v, indent=2, ensure_ascii=False, default=str)
        self.operations: dict[str, dict] = {}  # restores started here, by operation id
        self._ops_lock = threading.Lock()

    # -- pages ---------------------------------------------------------------------------
    def sessions(self, request: Request):
        q = request.query_params.get("q", "").strip().lower()
        show_deleted = request.query_params.get("deleted") == "1"
        sessions = self.client.list_sessions(include_deleted=show_deleted)
        pending: dict[str, int] = {}
        for a in self.client.list_approvals(status="pending"):
            pending[a.session_id] = pending.get(a.session_id, 0) + 1
        if q:
            sessions = [s for s in sessions if q in " ".join(
                filter(None, (s.id, s.name, s.workspace, s.container or "", s.host or "",
                              s.needs_attention or ""))).lower()]
        attention = request.query_params.get("attention") == "1"
        if attention:
            sessions = [s for s in sessions if s.needs_attention or pending.get(s.id)]
        sessions.sort(key=lambda s: (not (s.needs_attention or pending.get(s.id)),
                                     s.created_at), reverse=False)
        return self.page(request, "sessions.html", sessions=sessions, pending=pending, q=q,
                         attention=attention, show_deleted=show_deleted)

    def session(self, request: Request):
        sid = request.path_params["sid"]
        session = self.client.get_session(sid)
        page = max(0, _int(request.query_params.get("page"), 0))
        head = self.client.log_page(sid, 1)
        total = head[1]
        before = None if page == 0 else head[0][-1].seq + 1 - page * views.PAGE
        cps, _ = self.client.log_page(sid, views.PAGE, before) if before is None or \
            before > 0 else ([], total)
        tools = self.client.tool_calls(sid, after=[cp.parent_id for cp in cps
                                                   if cp.parent_id]) if cps else []
        others = self.client.list_sessions(include_deleted=True)
        line = views.timeline(cps, tools, others, page, total)
        origin = self.client.show(session.forked_from) if session.forked_from else None
        return self.page(request, "session.html", session=session, timeline=line,
                         origin=origin, tasks=self.client.tasks(sid)[0],
                         approvals=self.client.list_approvals(session_id=sid,
                                                              status="pending"))

    def checkpoint(self, request: Request):
        cid = request.path_params["cid"]
        cp = self.client.show(cid)
        changes = None
        if cp.parent_id:
            changes = self.client.diff(cp.parent_id, cp.id)
        messages = [views.message_parts(m) for m in cp.messages]
        new_from = max(0, len(messages) - cp.messages_added)
        return self.page(request, "checkpoint.html", cp=cp, messages=messages,
                         new_from=new_from, changes=changes,
                         session=self.client.get_session(cp.session_id))

    def diff(self, request: Request):
        a = request.query_params.get("from", "").strip()
        b = request.query_params.get("to", "").strip()
        if not a or not b:
            return self.page(request, "diff_pick.html", a=a, b=b)
        d = self.client.diff(a, b, patch=True)
        patches = views.split_patch(d.patch)
        rows = ([("added", p) for p in d.added] + [("modified", p) for p in d.modified]
                + [("deleted", p) for p in d.deleted])
        rows.sort(key=lambda r: r[1])
        page = _int(request.query_params.get("page"), 0)
        pages = max(1, -(-len(rows) // DIFF_PAGE))
        page = min(max(page, 0), pages - 1)
        shown = rows[page * DIFF_PAGE:(page + 1) * DIFF_PAGE]
        return self.page(request, "diff.html", a=self.client.show(a), b=self.client.show(b),
                         diff=d, rows=shown, patches=patches, page=page, pages=pages,
                         total=len(rows))

    def path(self, request: Request):
        """A path's history: the checkpoints that changed it, newest first, each with
        the tool calls before it and its patch."""
        sid = request.path_params["sid"]
        path = request.query_params.get("p", "").strip()
        session = self.client.get_session(sid)
        changes = self.client.path_history(sid, path, patch=True) if path else []
        return self.page(request, "path.html", session=session, path=path, changes=changes)

    def restore_preview(self, request: Request):
        sid = request.path_params["sid"]
        to = request.query_params.get("to", "")
        session = self.client.get_session(sid)
        target = self.client.show(to)
        other = target.session_id != sid
        preview = self.client.restore(sid, to, dry_run=True, acknowledge_side_effects=True,
                                      from_other_session=other)
        return self.page(request, "restore.html", session=session, target=target,
                         preview=preview, other=other)

    def restore(self, request: Request, form):
        sid = request.path_params["sid"]
        to = form.get("to", "")
        ack = form.get("acknowledge") == "yes"
        other = form.get("other") == "yes"
        op = uuid.uuid4().hex
        with self._ops_lock:
            self.operations[op] = {"session": sid, "to": to, "done": False}

        def run() -> None:
            try:
                r = self.client.restore(sid, to, acknowledge_side_effects=ack, operation_id=op,
                                        from_other_session=other)
                result = {"result": r}
            except WorldlineError as exc:
                result = {"error": f"{exc.code}: {exc.message}"}
            with self._ops_lock:
                self.operations[op].update(result, done=True)

        threading.Thread(target=run, name=f"console-restore-{op[:8]}", daemon=True).start()
        return RedirectResponse(f"/op/{op}", status_code=303)

    def operation(self, request: Request):
        op = request.path_params["op"]
        with self._ops_lock:
            state = dict(self.operations.get(op) or {})
        if not state:
            return self.error(request, 404, "NOT_FOUND", f"no restore {op} was started here")
        return self.page(request, "operation.html", op=op, state=state,
                         session=self.client.get_session(state["session"]))

    def progress(self, request: Request):
        op = request.path_params["op"]
        with self._ops_lock:
            state = dict(self.operations.get(op) or {})
        if not state:
            return JSONResponse({"error": "unknown operation"}, status_code=404)
        try:
            p = self.client.progress(op)
        except WorldlineError:
            p = {"phase": "starting", "done": 0, "total": 0, "files": 0, "finished": False}
        return JSONResponse({**p, "done_here": state["done"],
                             "error": state.get("error")})

    def fork(self, request: Request, form):
        s = self.client.fork(form.get("checkpoint", ""), name=form.get("name") or None)
        return RedirectResponse(f"/s/{s.id}", status_code=303)

    def approvals(self, request: Request):
        pending = self.client.list_approvals(status="pending")
        decided = [a for a in self.client.list_approvals() if a.status != "pending"]
        decided.sort(key=lambda a: a.decided_at or a.created_at, reverse=True)
        return self.page(request, "approvals.html", pending=pending, decided=decided[:100])

    def decide(self, request: Request, form):
        aid = request.path_params["aid"]
        approve = form.get("decision") == "approve"
        reason = form.get("reason", "")
        if not approve and not reason.strip():
            return self.error(request, 400, "INVALID_ARGUMENT", "a denial needs a reason")
        self.client.decide_approval(aid, approve=approve, reason=reason)
        return RedirectResponse("/approvals", status_code=303)

    def audit(self, request: Request):
        session = request.query_params.get("session") or None
        kind = request.query_params.get("kind") or None
        events = self.client.audit(session_id=session, kind=kind)
        events = list(reversed(events))[:500]
        return self.page(request, "audit.html", events=events,
                         verified=self.client.verify_audit(), session=session, kind=kind)

    def storage(self, request: Request):
        rows, days = [], {}
        for s in self.client.list_sessions(include_deleted=True):
            cps = self.client.log(s.id)
            rows.append((s, len(cps), sum(cp.bytes for cp in cps)))
            for cp in cps:
                day = cp.created_at[:10]
                days[day] = days.get(day, 0) + cp.bytes
        rows.sort(key=lambda r: -r[2])
        total, series = 0, []
        for day in sorted(days):
            total += days[day]
            series.append((day, total))
        gc = None
        if request.query_params.get("gc") == "1":
            gc = self.client.gc(dry_run=True)
        return self.page(request, "storage.html", rows=rows, chart=_bars(series), gc=gc)

    def rates(self, request: Request):
        per_session, per_agent, per_day = [], {}, {}
        for s in self.client.list_sessions(include_deleted=True):
            cps = self.client.log(s.id)
            restores = sum(1 for cp in cps if cp.kind == "restore")
            made = sum(1 for cp in cps if cp.kind == "checkpoint")
            agent = next((cp.resume.get("agent") for cp in reversed(cps)
                          if cp.resume and cp.resume.get("agent")), None) or "(client)"
            per_session.append((s, made, restores, _rate(restores, made)))
            a = per_agent.setdefault(agent, [0, 0])
            a[0], a[1] = a[0] + made, a[1] + restores
            for cp in cps:
                d = per_day.setdefault(cp.created_at[:10], [0, 0])
                d[0 if cp.kind == "checkpoint" else 1] += cp.kind in ("checkpoint", "restore")
        per_session.sort(key=lambda r: -(r[3] or 0))
        agents = sorted(((k, m, r, _rate(r, m)) for k, (m, r) in per_agent.items()),
                        key=lambda r: -(r[3] or 0))
        series = [(day, _rate(r, m) or 0.0) for day, (m, r) in sorted(per_day.items())]
        return self.page(request, "rates.html", sessions=per_session, agents=agents,
                         chart=_bars(series, percent=True))

    async def approval_events(self, request: Request):
        """Server-sent events: the pending approvals, whenever they change."""

        async def stream():
            last = None
            while not await request.is_disconnected():
                try:
                    pending = await run_in_threadpool(self.client.list_approvals,
                                                      status="pending")
                    now = [{"id": a.id, "session_id": a.session_id, "tool": a.tool,
                            "args": json.dumps(a.args, ensure_ascii=False, default=str),
                            "created_at": a.created_at, "expires_at": a.expires_at,
                            "checkpoint_id": a.checkpoint_id} for a in pending]
                except WorldlineError as exc:
                    now = {"error": f"{exc.code}: {exc.message}"}
                if now != last:
                    yield f"event: pending\ndata: {json.dumps(now)}\n\n"
                    last = now
                else:
                    yield ": still here\n\n"
                await asyncio.sleep(SSE_POLL)

        return StreamingResponse(stream(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-store"})

    async def csp_report(self, request: Request):
        """Counted, never kept; anyone may post one, so no more than CSP_REPORT bytes
        are read (a larger one is refused before it fills the console's memory)."""
        if _int(request.headers.get("content-length"), 0) > CSP_REPORT:
            return Response(status_code=413)
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > CSP_REPORT:
                return Response(status_code=413)
        self.keys.csp_reports += 1
        return Response(status_code=204)

    # -- plumbing ------------------------------------------------------------------------
    def page(self, request: Request, template: str, **context):
        return self.templates.TemplateResponse(request, template, context)

    def error(self, request: Request, status: int, code: str, message: str):
        return self.templates.TemplateResponse(request, "error.html",
                                               {"code": code, "message": message},
                                               status_code=status)

    def get(self, method):
        async def endpoint(request: Request):
            try:
                return await run_in_threadpool(method, request)
            except WorldlineError as exc:
                return self.error(request, _STATUS.get(exc.code, 500), exc.code, exc.message)
        return endpoint

    def post(self, method):
        async def endpoint(request: Request):
            form = await request.form()
            given = form.get("csrf") or request.headers.get("x-csrf-token")
            if not self.keys.csrf_ok(given):
                return PlainTextResponse("refused: the form's CSRF token is missing or wrong",
                                         status_code=403)
            try:
                return await run_in_threadpool(method, request, form)
            except WorldlineError as exc:
                return self.error(request, _STATUS.get(exc.code, 500), exc.code, exc.message)
        return endpoint


class _Guard(BaseHTTPMiddleware):
    """The token, the cookie and the origin of every request; the headers of every
    answer."""

    def __init__(self, app, keys: Keys, secure: bool) -> None:
        super().__init__(app)
        self.keys = keys
        self.secure = secure

    async def dispatch(self, request: Request, call_next):
        started = time.perf_counter()
        response = await self._check(request, call_next)
        for k, v in HEADERS.items():
            response.headers.setdefault(k, v)
        # the page's whole server time (the daemon's calls and the rendering), for the
        # browser's developer tools and `make bench`
        response.headers["Server-Timing"] = (
            f"app;dur={(time.perf_counter() - started) * 1000:.1f}")
        return response

    async def _check(self, request: Request, call_next):
        keys = self.keys
        if not same_user(request.scope.get("client"), request.scope.get("server")):
            return PlainTextResponse("refused: a connection from another user of this"
                                     " machine", status_code=403)
        if request.url.path == "/csp-report" and request.method == "POST":
            return await call_next(request)
        if request.method not in ("GET", "HEAD", "POST"):
            return PlainTextResponse("method not allowed", status_code=405)
        origin = request.headers.get("origin")
        if request.method == "POST" and origin and origin != _origin(request):
            return PlainTextResponse("refused: a request from another origin", status_code=403)
        if keys.cookie_ok(request.cookies.get(COOKIE)) or keys.token_ok(
                bearer(request.headers.get("authorization"))):
            return await call_next(request)
        if request.method == "GET" and keys.token_ok(request.query_params.get("token")):
            # The same page of this console: its path, never `//host` (another site),
            # and the query encoded again as it came (its values are decoded here).
            rest = urlencode([(k, v) for k, v in request.query_params.multi_items()
                              if k != "token"])
            path = quote("/" + request.url.path.lstrip("/"))
            response = RedirectResponse(path + (f"?{rest}" if rest else ""),
                                        status_code=303)
            response.set_cookie(COOKIE, keys.cookie, httponly=True, samesite="strict",
                                secure=self.secure, path="/")
            return response
        return PlainTextResponse("worldline console: open the URL that `worldline console`"
                                 " printed (it holds the token)", status_code=401)


def make_app(client, keys: Keys, secure: bool = False) -> Starlette:
    c = Console(client, keys, secure)
    routes = [
        Route("/", c.get(c.sessions)),
        Route("/s/{sid}", c.get(c.session)),
        Route("/s/{sid}/path", c.get(c.path)),
        Route("/s/{sid}/restore", c.get(c.restore_preview)),
        Route("/s/{sid}/restore", c.post(c.restore), methods=["POST"]),
        Route("/fork", c.post(c.fork), methods=["POST"]),
        Route("/c/{cid}", c.get(c.checkpoint)),
        Route("/diff", c.get(c.diff)),
        Route("/op/{op}", c.get(c.operation)),
        Route("/api/progress/{op}", c.get(c.progress)),
        Route("/approvals", c.get(c.approvals)),
        Route("/approvals/{aid}/decide", c.post(c.decide), methods=["POST"]),
        Route("/events/approvals", c.approval_events),
        Route("/audit", c.get(c.audit)),
        Route("/storage", c.get(c.storage)),
        Route("/rates", c.get(c.rates)),
        Route("/csp-report", c.csp_report, methods=["POST"]),
        Mount("/static", StaticFiles(directory=str(HERE / "static")), name="static"),
    ]
    app = Starlette(routes=routes, middleware=[Middleware(_Guard, keys=keys, secure=secure)])
    app.state.console = c
    return app


def _origin(request: Request) -> str:
    return f"{request.url.scheme}://{request.headers.get('host', '')}"


def _int(text: str | None, default: int) -> int:
    try:
        return int(text) if text is not None else default
    except ValueError:
        return default


def _rate(restores: int, checkpoints: int) -> float | None:
    return None if not checkpoints else 100.0 * restores / checkpoints


def _when(text: str | None) -> str:
    if not text:
        return ""
    try:
        return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).strftime(
            "%Y-%m-%d %H:%M:%S")
    except ValueError:
        return text


def _size(n: int | float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def _bars(series: list[tuple[str, float]], percent: bool = False) -> dict:
    """A bar chart's geometry (an SVG drawn by the template): one bar a day."""
    width, height = 640, 160
    if not series:
        return {"bars": [], "width": width, "height": height, "top": 0}
    top = max(v for _, v in series) or 1
    step = width / len(series)
    bars = [{"x": round(i * step + 1, 1), "w": max(1.0, round(step - 2, 1)),
             "h": round(height * v / top, 1), "y": round(height - height * v / top, 1),
             "label": day, "value": (f"{v:.1f} %" if percent else _size(v))}
            for i, (day, v) in enumerate(series)]
    return {"bars": bars, "width": width, "height": height,
            "top": f"{top:.1f} %" if percent else _size(top)}
