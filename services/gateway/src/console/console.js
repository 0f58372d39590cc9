// The Switchboard ops console: one page over the JSON its own address serves (see mod.rs).
// No framework and no build step; every text from the server is set as text, never as HTML.
const TOKEN_KEY = "switchboard-console-token";
const REFRESH_MS = 3000;
const $ = (sel) => document.querySelector(sel);

let token = sessionStorage.getItem(TOKEN_KEY);
let view = "sessions";
let openSession = null;
let timer = null;

class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

async function api(path, options = {}) {
  const res = await fetch(path, {
    ...options,
    headers: { Authorization: `Bearer ${token}`, ...(options.headers || {}) },
  });
  const body = await res.json().catch(() => ({}));
  if (res.status === 401) {
    signOut(body.error ? body.error.message : "signed out");
    throw new ApiError(401, "signed out");
  }
  if (!res.ok) {
    throw new ApiError(res.status, (body.error && body.error.message) || `${res.status}`);
  }
  return body;
}

function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") e.className = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else if (v !== undefined && v !== null) e.setAttribute(k, v);
  }
  for (const c of children) e.append(c instanceof Node ? c : document.createTextNode(c ?? ""));
  return e;
}

function when(t) {
  return t ? new Date(t).toLocaleString() : "—";
}

function showError(e) {
  if (e instanceof ApiError && e.status === 401) return;
  $("#app-error").textContent = e ? e.message || String(e) : "";
}

// ---- signing in ----
async function signIn(candidate) {
  token = candidate;
  const me = await api("/console/api/me");
  sessionStorage.setItem(TOKEN_KEY, token);
  $("#who").textContent = me.owner;
  $("#login-view").hidden = true;
  $("#app-view").hidden = false;
  show(view);
}

function signOut(reason) {
  token = null;
  sessionStorage.removeItem(TOKEN_KEY);
  clearInterval(timer);
  $("#app-view").hidden = true;
  $("#login-view").hidden = false;
  $("#login-error").textContent = reason || "";
  $("#login-key").focus();
}

$("#login-form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  try {
    await signIn($("#login-key").value.trim());
    $("#login-key").value = "";
  } catch (e) {
    if (!(e instanceof ApiError && e.status === 401)) $("#login-error").textContent = e.message;
  }
});
$("#sign-out").addEventListener("click", () => signOut(""));

// ---- views ----
const loaders = {
  sessions: loadSessions,
  transcript: () => loadTranscript(openSession),
  search: null,
  categories: loadCategories,
  operations: loadOperations,
};
// Refreshed while shown: what changes by itself.
const live = new Set(["sessions", "transcript", "operations"]);

function show(name) {
  view = name;
  for (const v of Object.keys(loaders)) $(`#${v}-view`).hidden = v !== name;
  for (const b of document.querySelectorAll("nav button")) {
    if (b.dataset.view === name || (name === "transcript" && b.dataset.view === "sessions")) {
      b.setAttribute("aria-current", "page");
    } else b.removeAttribute("aria-current");
  }
  showError(null);
  refresh();
  clearInterval(timer);
  if (live.has(name)) timer = setInterval(refresh, REFRESH_MS);
  $("#live").textContent = live.has(name) ? "Live" : "";
}

async function refresh() {
  const load = loaders[view];
  if (!load || !token) return;
  try {
    await load();
    if (live.has(view)) $("#live").textContent = `Live · updated ${new Date().toLocaleTimeString()}`;
  } catch (e) {
    showError(e);
  }
}

for (const b of document.querySelectorAll("nav button")) {
  b.addEventListener("click", () => show(b.dataset.view));
}

// ---- sessions ----
function sessionQuery() {
  const f = new FormData($("#sessions-filter"));
  const q = new URLSearchParams();
  for (const [k, v] of f) if (v) q.set(k, v);
  q.set("limit", "100");
  return q;
}

// ---- escalations: the queue above the sessions, open ones longest waiting first ----
let escalationsDrawn = null;
async function loadEscalations() {
  let body;
  try {
    body = await api("/api/v1/escalations?status=open&limit=50");
  } catch (e) {
    // A sign-in without ops:read sees the sessions alone.
    if (e instanceof ApiError && e.status === 403) {
      $("#escalations").hidden = true;
      return;
    }
    throw e;
  }
  $("#escalations").hidden = false;
  // Drawn again only when it changed: a refresh must not swap a button under the pointer.
  const drawn = JSON.stringify(body.escalations.map((x) => [x.id, x.last_messages.length]));
  if (drawn === escalationsDrawn) return;
  escalationsDrawn = drawn;
  const items = body.escalations.map((x) =>
    el(
      "li",
      { "data-escalation": x.id, "data-label": x.label },
      el(
        "div",
        { class: "head" },
        el("strong", {}, x.label.replaceAll("_", " ")),
        ` · ${x.person_name ? `${x.person_name} (${x.person_id})` : x.person_id} · ${x.agent} · ${x.channel} · raised ${when(x.raised_at)}`,
      ),
      el(
        "ol",
        { class: "recent" },
        ...x.last_messages.map((m) => el("li", { class: m.direction }, `${m.direction === "inbound" ? "them" : x.agent}: ${m.text}`)),
      ),
      el(
        "div",
        { class: "actions" },
        el("button", { type: "button", class: "open", onclick: () => openTranscript(x.session_id) }, "Open conversation"),
        el("button", { type: "button", class: "take-over", "aria-label": `Take over the conversation of ${x.person_id}`, onclick: () => takeOverFromQueue(x.session_id) }, "Take over"),
        el("button", { type: "button", class: "acknowledge", "aria-label": `Acknowledge the ${x.label} of ${x.person_id}`, onclick: () => acknowledge(x.id) }, "Acknowledge"),
      ),
    ),
  );
  $("#escalations-list").replaceChildren(...(items.length ? items : [el("li", { class: "none" }, "No open escalations.")]));
}

// Straight from the queue to the conversation, the agent paused (409 when someone else has it:
// the transcript says who).
async function takeOverFromQueue(session) {
  try {
    const t = await api(`/api/v1/sessions/${session}/takeover`, { method: "POST" });
    $("#live").textContent = `Taken over by ${t.taken_by}`;
  } catch (e) {
    showError(e);
  }
  takeoverDrawn = null;
  openTranscript(session);
}

async function acknowledge(id) {
  try {
    const x = await api(`/api/v1/escalations/${id}/acknowledge`, { method: "POST" });
    $("#live").textContent = `Escalation acknowledged by ${x.acknowledged_by}`;
    await loadEscalations();
  } catch (e) {
    showError(e);
  }
}

async function loadSessions() {
  await loadEscalations();
  const body = await api(`/api/v1/sessions?${sessionQuery()}`);
  const rows = body.sessions.map((s) =>
    el(
      "tr",
      {
        class: "clickable",
        tabindex: "0",
        "data-session": s.id,
        onclick: () => openTranscript(s.id),
        onkeydown: (e) => e.key === "Enter" && openTranscript(s.id),
      },
      el("td", {}, s.person.id),
      el("td", {}, s.agent.name),
      el("td", { class: `status-${s.status}` }, s.status),
      el("td", {}, s.channels.join(", ")),
      el("td", { class: "num" }, `${s.turns.done}/${s.turns.opened}`),
      el("td", {}, when(s.last_message_at)),
    ),
  );
  $("#sessions-table tbody").replaceChildren(...rows);
}

$("#sessions-filter").addEventListener("submit", (ev) => {
  ev.preventDefault();
  refresh();
});

function openTranscript(id) {
  openSession = id;
  show("transcript");
}
$("#transcript-back").addEventListener("click", () => show("sessions"));

async function all(path, key) {
  let items = [];
  let after = "";
  for (let page = 0; page < 20; page++) {
    const body = await api(`${path}?limit=500${after ? `&after=${after}` : ""}`);
    items = items.concat(body[key]);
    if (!body.next) break;
    after = body.next;
  }
  return items;
}

function journalText(e) {
  const d = e.detail || {};
  const parts = Object.entries(d)
    .filter(([, v]) => v !== null && typeof v !== "object")
    .map(([k, v]) => `${k}: ${v}`);
  return `${e.kind.replaceAll("_", " ")}${e.seq ? ` (turn ${e.seq})` : ""}${parts.length ? ` — ${parts.join(", ")}` : ""}`;
}

async function loadTranscript(id) {
  const [session, messages, events] = await Promise.all([
    api(`/api/v1/sessions/${id}`),
    all(`/api/v1/sessions/${id}/messages`, "messages"),
    all(`/api/v1/sessions/${id}/events`, "events"),
  ]);
  const s = session.session || session;
  $("#transcript-h").textContent = `${s.person.id} with ${s.agent.name}`;
  const meta = [
    ["Session", s.id],
    ["Status", s.status],
    ["Channels", s.channels.join(", ")],
    ["Engine session", s.engine_session_id || "—"],
    ["Resets", String(s.resets)],
    ["Started", when(s.created_at)],
  ];
  $("#transcript-meta").replaceChildren(...meta.flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, v)]));
  const summary = session.summary;
  $("#transcript-summary").textContent = summary ? `Summary (v${summary.version}): ${summary.text}` : "";
  const timeline = [
    ...messages.map((m) => {
      const who = m.direction === "inbound" ? s.person.id : m.operator ? `operator ${m.operator}` : m.agent;
      const kind = m.operator ? `${m.direction} operator` : m.direction;
      return { at: m.at, node: el("li", { class: kind, "data-message": m.id }, el("span", { class: "when" }, `${who} · ${m.channel} · ${when(m.at)}`), m.text) };
    }),
    ...events.map((e) => ({ at: e.at, node: el("li", { class: "journal", "data-event": e.kind }, `${when(e.at)} · ${journalText(e)}`) })),
  ].sort((a, b) => new Date(a.at) - new Date(b.at));
  $("#transcript").replaceChildren(...timeline.map((t) => t.node));
  await loadTakeover(id);
}

// ---- an operator steps in: take over, reply, hand back (docs/sessions.md) ----
// The section is static and only its state is redrawn, so a reply being typed survives the
// transcript's refresh. A draft keeps one Idempotency-Key until it is sent: a double click or a
// retry after a dropped answer sends it once.
let takeoverDrawn = null;
let draftKey = null;
async function loadTakeover(id) {
  let body;
  try {
    body = await api(`/api/v1/sessions/${id}/takeover`);
  } catch (e) {
    if (e instanceof ApiError && e.status === 403) {
      $("#takeover").hidden = true;
      return;
    }
    throw e;
  }
  const t = body.takeover && !body.takeover.ended_at ? body.takeover : null;
  $("#takeover").hidden = false;
  const drawn = JSON.stringify([id, t && t.id]);
  if (drawn === takeoverDrawn) return;
  takeoverDrawn = drawn;
  $("#takeover-state").textContent = t
    ? `Taken over by ${t.taken_by} since ${when(t.started_at)}: the agent is paused; the person's messages wait for you.`
    : "The agent has this conversation.";
  $("#takeover-take").hidden = !!t;
  $("#takeover-handback").hidden = !t;
  $("#takeover-reply").hidden = !t;
}

async function takeoverStep(path, options, done) {
  try {
    const x = await api(`/api/v1/sessions/${openSession}/${path}`, options);
    $("#live").textContent = done(x);
    showError(null);
    takeoverDrawn = null;
    await loadTranscript(openSession);
    return true;
  } catch (e) {
    showError(e);
    return false;
  }
}

$("#takeover-take").addEventListener("click", () =>
  takeoverStep("takeover", { method: "POST" }, (t) => `Taken over by ${t.taken_by}`),
);
$("#takeover-handback").addEventListener("click", () =>
  takeoverStep("handback", { method: "POST" }, (x) =>
    x.agent_answers ? "Handed back: the agent answers what is left" : "Handed back to the agent",
  ),
);
$("#takeover-reply").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  const text = $("#takeover-text").value.trim();
  if (!text) return;
  draftKey = draftKey || (crypto.randomUUID ? crypto.randomUUID() : `${Date.now()}-${Math.floor(Math.random() * 1e9)}`);
  const sent = await takeoverStep(
    "replies",
    { method: "POST", headers: { "Content-Type": "application/json", "Idempotency-Key": draftKey }, body: JSON.stringify({ text }) },
    (x) => `Sent on ${x.channel}`,
  );
  if (sent) {
    $("#takeover-text").value = "";
    draftKey = null;
  }
});

// ---- search ----
$("#search-form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  const f = new FormData(ev.target);
  const q = new URLSearchParams();
  for (const [k, v] of f) if (v) q.set(k, v);
  try {
    const body = await api(`/api/v1/search?${q}`);
    $("#search-note").textContent = body.note || body.vector_error || "";
    const items = body.hits.map((h) =>
      el(
        "li",
        { tabindex: "0", "data-session": h.session_id, onclick: () => openTranscript(h.session_id), onkeydown: (e) => e.key === "Enter" && openTranscript(h.session_id) },
        el("div", {}, h.text),
        el(
          "div",
          { class: "why" },
          `${h.person_id} · ${h.agent} · ${h.channel} · ${when(h.at)} · found by ${[h.by_meaning && "meaning", h.by_words && "words"].filter(Boolean).join(" and ")}${h.category ? ` · ${h.category}` : ""}`,
        ),
      ),
    );
    $("#search-results").replaceChildren(...(items.length ? items : [el("li", {}, "Nothing found.")]));
  } catch (e) {
    showError(e);
  }
});

// ---- categories ----
function isoDay(d) {
  return d.toISOString().slice(0, 10);
}

async function loadCategories() {
  const form = $("#categories-form");
  if (!form.from.value) form.from.value = isoDay(new Date(Date.now() - 13 * 86400e3));
  if (!form.to.value) form.to.value = isoDay(new Date());
  const q = new URLSearchParams({ from: form.from.value, to: isoDay(new Date(new Date(form.to.value).getTime() + 86400e3)) });
  if (form.agent.value) q.set("agent", form.agent.value);
  const body = await api(`/api/v1/analytics/categories?${q}`);
  drawChart(body.per_day, form.from.value, form.to.value);
  const totals = new Map();
  for (const d of body.per_day) totals.set(d.label, (totals.get(d.label) || 0) + d.exchanges);
  const rows = [...totals].sort((a, b) => b[1] - a[1]).map(([label, n]) => el("tr", {}, el("td", {}, label), el("td", { class: "num" }, String(n))));
  $("#categories-table tbody").replaceChildren(...rows);
}
$("#categories-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  refresh();
});

const PALETTE = ["#1f4fd1", "#d1651f", "#2e9e5b", "#9b3fc2", "#c2a03f", "#3fa7c2", "#c23f6c", "#6b7280"];
const SVG = "http://www.w3.org/2000/svg";
function svg(tag, attrs, text) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}

function drawChart(perDay, from, to) {
  const days = [];
  for (let t = new Date(from).getTime(); t <= new Date(to).getTime(); t += 86400e3) days.push(isoDay(new Date(t)));
  const labels = [...new Set(perDay.map((d) => d.label))].sort();
  const count = new Map(perDay.map((d) => [`${d.day}|${d.label}`, d.exchanges]));
  const totals = days.map((day) => labels.reduce((n, l) => n + (count.get(`${day}|${l}`) || 0), 0));
  const max = Math.max(1, ...totals);
  const W = 760, H = 260, left = 40, bottom = 40, top = 10;
  const bw = (W - left - 10) / Math.max(days.length, 1);
  const root = svg("svg", { viewBox: `0 0 ${W} ${H + 30 + 18 * Math.ceil(labels.length / 4)}`, role: "img", "aria-label": `Exchanges per label per day, ${from} to ${to}` });
  root.append(svg("line", { x1: left, y1: H - bottom, x2: W - 10, y2: H - bottom, stroke: "#999" }));
  root.append(svg("text", { x: 4, y: top + 10, "font-size": 11, fill: "#555" }, String(max)));
  days.forEach((day, i) => {
    let y = H - bottom;
    labels.forEach((label, li) => {
      const n = count.get(`${day}|${label}`) || 0;
      if (!n) return;
      const h = ((H - bottom - top) * n) / max;
      y -= h;
      const r = svg("rect", { x: left + i * bw + 2, y, width: Math.max(bw - 4, 1), height: h, fill: PALETTE[li % PALETTE.length], "data-label": label, "data-day": day });
      r.append(svg("title", {}, `${day} ${label}: ${n}`));
      root.append(r);
    });
    if (days.length <= 16 || i % Math.ceil(days.length / 16) === 0) {
      root.append(svg("text", { x: left + i * bw + bw / 2, y: H - bottom + 14, "font-size": 10, "text-anchor": "middle", fill: "#555" }, day.slice(5)));
    }
  });
  labels.forEach((label, li) => {
    const x = left + (li % 4) * 180, y = H + 10 + 18 * Math.floor(li / 4);
    root.append(svg("rect", { x, y, width: 12, height: 12, fill: PALETTE[li % PALETTE.length] }));
    root.append(svg("text", { x: x + 16, y: y + 10, "font-size": 12 }, label));
  });
  $("#categories-chart").replaceChildren(root);
}

// ---- operations ----
async function loadOperations() {
  const [status, letters] = await Promise.all([api("/console/api/status"), api("/console/api/dead-letters?limit=200")]);
  const n = (v) => el("td", { class: "num" }, v === undefined ? "—" : String(v));
  $("#stages-table tbody").replaceChildren(
    ...status.stages.map((s) =>
      el(
        "tr",
        { "data-stage": s.stage },
        el("td", {}, s.stage),
        el("td", {}, s.worker),
        n(s.pending),
        n(s.in_hand),
        n(s.redelivered),
        n(s.pulling),
        el("td", { class: `num${s.dead_letters ? " bad" : ""}` }, String(s.dead_letters)),
      ),
    ),
  );
  const waiting = Object.entries(status.waiting_for_runner);
  $("#runners").replaceChildren(
    ...(waiting.length
      ? waiting.map(([agent, k]) => el("li", { class: "bad", "data-agent": agent }, `${agent}: runner down (breaker open), ${k} session(s) waiting`))
      : [el("li", {}, "Every runner answers (no breaker open).")]),
  );
  $("#dispatchers").textContent = `Dispatchers alive: ${status.dispatchers_alive}`;
  $("#streams-table tbody").replaceChildren(
    ...status.streams.map((s) => el("tr", {}, el("td", {}, s.name), n(s.messages), n(s.bytes))),
  );
  $("#dlq-table tbody").replaceChildren(
    ...(letters.length
      ? letters.map((d) =>
          el(
            "tr",
            { "data-seq": d.seq },
            el("td", { class: "num" }, String(d.seq)),
            el("td", {}, d.stage),
            el("td", {}, when(d.failed_at)),
            el("td", {}, d.error),
            n(d.deliveries),
            el("td", {}, el("button", { type: "button", class: "replay", "aria-label": `Replay dead letter ${d.seq}`, onclick: () => replay(d.seq) }, "Replay")),
          ),
        )
      : [el("tr", {}, el("td", { colspan: "6" }, "No dead letters."))]),
  );
}

async function replay(seq) {
  try {
    await api(`/console/api/dead-letters/${seq}/replay`, { method: "POST" });
    $("#live").textContent = `Dead letter ${seq} replayed`;
    await loadOperations();
  } catch (e) {
    showError(e);
  }
}

// ---- start ----
if (token) {
  signIn(token).catch(() => signOut(""));
} else {
  signOut("");
}
