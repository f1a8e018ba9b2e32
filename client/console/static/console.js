// worldline console: the pending approvals, live; a restore's progress; keyboard moves.
// Everything the agent wrote is set with textContent, never as HTML.
"use strict";
(function () {
  const csrf = document.querySelector('meta[name="csrf-token"]').content;

  function el(tag, attrs, text) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
    if (text !== undefined) e.textContent = text;
    return e;
  }

  // -- approvals, live (server-sent events) ---------------------------------------------
  const badge = document.getElementById("pending-count");
  const table = document.querySelector("#pending tbody");
  const events = new EventSource("/events/approvals");
  events.addEventListener("pending", (msg) => {
    const pending = JSON.parse(msg.data);
    if (!Array.isArray(pending)) return;
    badge.textContent = pending.length ? String(pending.length) : "";
    if (!table) return;
    const shown = Array.from(table.rows).map((r) => r.dataset.id).join(",");
    if (shown === pending.map((a) => a.id).join(",")) return;
    table.replaceChildren(...pending.map(row));
    const none = document.getElementById("none-pending");
    if (none) none.hidden = pending.length > 0;
    const live = document.getElementById("pending-live");
    if (live) live.textContent = pending.length + " waiting";
  });

  function when(iso) {  // as the server's pages show times: 2026-11-29 06:08:06
    return String(iso || "").replace("T", " ").replace(/\.\d+/, "").replace(/(Z|[+-]\d\d:\d\d)$/, "");
  }

  function row(a) {
    const tr = el("tr", {"data-id": a.id});
    tr.append(el("td", {class: "tool"}, a.tool));
    const args = el("td"); args.append(el("pre", {class: "args"}, a.args)); tr.append(args);
    const s = el("td"); s.append(el("a", {href: "/s/" + a.session_id, class: "id"}, a.session_id)); tr.append(s);
    const c = el("td"); c.append(el("a", {href: "/c/" + a.checkpoint_id, class: "id"}, a.checkpoint_id.slice(0, 10))); tr.append(c);
    tr.append(el("td", {}, when(a.created_at)), el("td", {}, when(a.expires_at)));
    const form = el("form", {method: "post", action: "/approvals/" + encodeURIComponent(a.id) + "/decide", class: "decide"});
    form.append(el("input", {type: "hidden", name: "csrf", value: csrf}),
                el("input", {name: "reason", placeholder: "reason (needed to deny)", "aria-label": "reason"}),
                el("button", {name: "decision", value: "approve", type: "submit"}, "Approve"),
                el("button", {name: "decision", value: "deny", type: "submit"}, "Deny"));
    const d = el("td"); d.append(form); tr.append(d);
    return tr;
  }

  // -- a restore's progress -----------------------------------------------------------
  const progress = document.getElementById("progress");
  if (progress) {
    const bar = document.getElementById("progress-bar");
    const text = document.getElementById("progress-text");
    const tick = async () => {
      const r = await fetch("/api/progress/" + encodeURIComponent(progress.dataset.op));
      const p = await r.json();
      if (p.done_here) { location.reload(); return; }
      if (p.total) { bar.max = p.total; bar.value = p.done; } else { bar.removeAttribute("value"); }
      text.textContent = (p.phase || "working") + (p.total ? ` ${p.done} of ${p.total} ${p.unit}` : "") +
        (p.files ? `, ${p.files} file(s)` : "");
      setTimeout(tick, 200);
    };
    tick();
  }

  // -- keyboard -------------------------------------------------------------------------
  const nodes = Array.from(document.querySelectorAll("svg.timeline a.node"));
  let at = -1, prefix = false;
  document.addEventListener("keydown", (e) => {
    const t = e.target;
    if (t instanceof HTMLInputElement || t instanceof HTMLTextAreaElement || e.metaKey || e.ctrlKey || e.altKey) return;
    if (prefix) {
      prefix = false;
      if (e.key === "s") location.href = "/";
      else if (e.key === "a") location.href = "/approvals";
      return;
    }
    if (e.key === "g") { prefix = true; return; }
    if (e.key === "/") { const s = document.getElementById("search"); if (s) { e.preventDefault(); s.focus(); } return; }
    if ((e.key === "j" || e.key === "k") && nodes.length) {
      at = Math.max(0, Math.min(nodes.length - 1, at + (e.key === "j" ? 1 : -1)));
      nodes.forEach((n, i) => n.classList.toggle("current", i === at));
      nodes[at].focus();
    }
  });
})();
