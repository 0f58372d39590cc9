/*
 * Switchboard chat widget: one script tag puts a chat panel on any page.
 *
 *   <script src="https://<gateway>/widget.js" data-agent="reggie_oc"
 *           data-token="<the page's chat JWT>"></script>
 *
 * Attributes: data-agent (required); data-token (the host page's chat JWT) or data-token-url
 * (fetched, with the page's cookies, before each connection: the token as text or as
 * {"token": "..."}); data-channel (default header_widget); data-title; data-open="true" opens
 * the panel at load; data-heartbeat-s (default 25) how long a silent connection is trusted.
 * window.SwitchboardWidget.setToken(jwt) hands a token over later.
 *
 * The socket is the gateway's /ws/chat: a message is kept (in this browser's storage, per
 * user and agent) until the gateway says it is accepted and sent again after a reconnect (the
 * same id: answered once); a reconnect asks for every reply after the last one shown
 * (?since=), so a reply that arrived while the connection was down is shown. Files go to
 * /chat/uploads first and the message names them. Text is only ever set as text.
 */
(function () {
  "use strict";
  var script = document.currentScript;
  if (!script || window.SwitchboardWidget) return;
  var cfg = script.dataset;
  var agent = cfg.agent || "";
  var channel = cfg.channel || "header_widget";
  var base = new URL(cfg.gateway || script.src, location.href);
  var gateway = base.origin;
  var wsBase = gateway.replace(/^http/, "ws");
  var title = cfg.title || "Chat";
  var MAX_ITEMS = 200;
  // A connection that dies silently (a dead network keeps it half open) is noticed by a ping
  // the gateway must answer: none within HEARTBEAT_MS after it, or no open socket within
  // HEARTBEAT_MS of trying, and the widget connects afresh.
  var HEARTBEAT_MS = 1000 * (Number(cfg.heartbeatS) > 0 ? Number(cfg.heartbeatS) : 25);
  var heartbeat = null;
  var connectedOnce = false;

  var token = cfg.token || null;
  var socket = null;
  var retryMs = 500;
  var retryTimer = null;
  var stopped = false;
  var state = { lastSeq: 0, items: [] };
  var storageKey = null;

  // ---- storage: one transcript per gateway, agent and user (never another user's) ----
  function subjectOf(jwt) {
    try {
      var part = jwt.split(".")[1].replace(/-/g, "+").replace(/_/g, "/");
      return JSON.parse(decodeURIComponent(escape(atob(part)))).sub || "";
    } catch (e) {
      return "";
    }
  }
  function load() {
    storageKey = "switchboard-widget:" + gateway + ":" + agent + ":" + subjectOf(token);
    try {
      var saved = JSON.parse(localStorage.getItem(storageKey) || "null");
      if (saved && Array.isArray(saved.items)) state = saved;
      else state = { lastSeq: 0, items: [] };
    } catch (e) {
      state = { lastSeq: 0, items: [] };
    }
  }
  function save() {
    if (state.items.length > MAX_ITEMS) state.items = state.items.slice(-MAX_ITEMS);
    try {
      localStorage.setItem(storageKey, JSON.stringify(state));
    } catch (e) {
      /* storage full or off: the conversation still works, it is just not kept */
    }
  }

  // ---- the panel ----
  var root = document.createElement("div");
  root.id = "switchboard-widget";
  root.className = "sbw";
  var style = document.createElement("style");
  style.textContent =
    ".sbw{position:fixed;right:16px;bottom:16px;z-index:2147483000;font:14px/1.4 system-ui,sans-serif;color:#111}" +
    ".sbw *{box-sizing:border-box}" +
    ".sbw-launch{border:0;border-radius:24px;padding:10px 18px;background:#1f4fd1;color:#fff;font:inherit;cursor:pointer}" +
    ".sbw-launch:focus-visible,.sbw button:focus-visible,.sbw textarea:focus-visible{outline:3px solid #f5a623;outline-offset:2px}" +
    ".sbw-panel{width:340px;max-width:calc(100vw - 32px);height:460px;max-height:calc(100vh - 90px);display:flex;flex-direction:column;background:#fff;border:1px solid #c8cdd8;border-radius:10px;box-shadow:0 8px 28px rgba(0,0,0,.18);margin-bottom:10px}" +
    ".sbw-panel[hidden]{display:none}" +
    ".sbw-head{display:flex;align-items:center;justify-content:space-between;padding:8px 12px;border-bottom:1px solid #e3e6ee}" +
    ".sbw-head h2{font-size:15px;margin:0}" +
    ".sbw-close{border:0;background:none;font-size:20px;cursor:pointer;padding:0 4px}" +
    ".sbw-status{font-size:12px;color:#555;padding:2px 12px}" +
    ".sbw-log{flex:1;overflow-y:auto;padding:8px 12px;margin:0;list-style:none}" +
    ".sbw-log li{margin:6px 0;padding:6px 10px;border-radius:8px;max-width:85%;white-space:pre-wrap;word-wrap:break-word}" +
    ".sbw-me{background:#1f4fd1;color:#fff;margin-left:auto!important}" +
    ".sbw-reply{background:#eef0f5}" +
    ".sbw-notice{background:#fff6dd;font-style:italic}" +
    ".sbw-pending{opacity:.65}" +
    ".sbw-form{display:flex;gap:6px;padding:8px;border-top:1px solid #e3e6ee;align-items:flex-end}" +
    ".sbw-form textarea{flex:1;resize:none;height:40px;font:inherit;padding:6px;border:1px solid #c8cdd8;border-radius:6px}" +
    ".sbw-form button{font:inherit;padding:8px 10px;border:0;border-radius:6px;background:#1f4fd1;color:#fff;cursor:pointer}" +
    ".sbw-attach{background:#eef0f5!important;color:#111!important}" +
    ".sbw-files{font-size:12px;padding:0 12px;color:#333}" +
    ".sbw-hide{position:absolute!important;width:1px;height:1px;overflow:hidden;clip:rect(0 0 0 0);white-space:nowrap}";
  root.appendChild(style);

  var panelId = "sbw-panel-" + Math.random().toString(36).slice(2);
  var panel = el("section", "sbw-panel", { id: panelId, role: "dialog", "aria-label": title });
  panel.hidden = true;
  var head = el("div", "sbw-head");
  var h2 = el("h2");
  h2.textContent = title;
  var close = el("button", "sbw-close", { type: "button", "aria-label": "Close chat" });
  close.textContent = "\u00d7";
  head.appendChild(h2);
  head.appendChild(close);
  var status = el("div", "sbw-status", { role: "status" });
  var log = el("ul", "sbw-log", { role: "log", "aria-live": "polite", "aria-label": "Conversation" });
  var files = el("div", "sbw-files", { "aria-live": "polite" });
  var form = el("form", "sbw-form");
  var inputId = panelId + "-input";
  var label = el("label", "sbw-hide", { for: inputId });
  label.textContent = "Message";
  var input = el("textarea", "sbw-input", { id: inputId, rows: "1", placeholder: "Type a message" });
  var fileId = panelId + "-file";
  var fileLabel = el("label", "sbw-hide", { for: fileId });
  fileLabel.textContent = "Attach files";
  var fileInput = el("input", "sbw-hide", { id: fileId, type: "file", multiple: "" });
  var attach = el("button", "sbw-attach", { type: "button", "aria-label": "Attach files" });
  attach.appendChild(clipIcon());
  var send = el("button", "sbw-send", { type: "submit" });
  send.textContent = "Send";
  form.appendChild(label);
  form.appendChild(input);
  form.appendChild(fileLabel);
  form.appendChild(fileInput);
  form.appendChild(attach);
  form.appendChild(send);
  panel.appendChild(head);
  panel.appendChild(status);
  panel.appendChild(log);
  panel.appendChild(files);
  panel.appendChild(form);
  var launch = el("button", "sbw-launch", {
    type: "button",
    "aria-expanded": "false",
    "aria-controls": panelId,
  });
  launch.textContent = title;
  root.appendChild(panel);
  root.appendChild(launch);

  // A paper clip drawn, not a glyph: no page or system font is assumed.
  function clipIcon() {
    var ns = "http://www.w3.org/2000/svg";
    var svg = document.createElementNS(ns, "svg");
    svg.setAttribute("viewBox", "0 0 24 24");
    svg.setAttribute("width", "16");
    svg.setAttribute("height", "16");
    svg.setAttribute("aria-hidden", "true");
    var path = document.createElementNS(ns, "path");
    path.setAttribute("d", "M16.5 6.5l-7.8 7.8a2 2 0 0 0 2.8 2.8l8.1-8.1a4 4 0 0 0-5.7-5.7l-8.3 8.3a6 6 0 0 0 8.5 8.5l7.4-7.4");
    path.setAttribute("fill", "none");
    path.setAttribute("stroke", "currentColor");
    path.setAttribute("stroke-width", "2");
    path.setAttribute("stroke-linecap", "round");
    svg.appendChild(path);
    return svg;
  }

  function el(tag, cls, attrs) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    for (var k in attrs || {}) e.setAttribute(k, attrs[k]);
    return e;
  }

  function open() {
    panel.hidden = false;
    launch.setAttribute("aria-expanded", "true");
    input.focus();
    log.scrollTop = log.scrollHeight;
  }
  function hide() {
    panel.hidden = true;
    launch.setAttribute("aria-expanded", "false");
    launch.focus();
  }
  launch.addEventListener("click", function () {
    panel.hidden ? open() : hide();
  });
  close.addEventListener("click", hide);
  panel.addEventListener("keydown", function (e) {
    if (e.key === "Escape") hide();
  });
  input.addEventListener("keydown", function (e) {
    if (e.key === "Enter" && !e.shiftKey) {
      e.preventDefault();
      form.requestSubmit ? form.requestSubmit() : submit();
    }
  });
  attach.addEventListener("click", function () {
    fileInput.click();
  });
  fileInput.addEventListener("change", function () {
    var names = Array.prototype.map.call(fileInput.files, function (f) {
      return f.name;
    });
    files.textContent = names.length ? "Attached: " + names.join(", ") : "";
  });
  form.addEventListener("submit", function (e) {
    e.preventDefault();
    submit();
  });

  function render() {
    log.textContent = "";
    state.items.forEach(function (item) {
      var li = el("li", "sbw-" + item.kind + (item.kind === "me" && !item.accepted ? " sbw-pending" : ""), {
        "data-id": item.id,
      });
      var who = el("span", "sbw-hide");
      who.textContent = item.kind === "me" ? "You: " : item.kind === "notice" ? "Notice: " : agentName(item) + ": ";
      li.appendChild(who);
      li.appendChild(document.createTextNode(item.text));
      if (item.files && item.files.length) {
        var f = el("div", "sbw-filenames");
        f.appendChild(clipIcon());
        f.appendChild(document.createTextNode(" " + item.files.join(", ")));
        li.appendChild(f);
      }
      log.appendChild(li);
    });
    log.scrollTop = log.scrollHeight;
  }
  function agentName(item) {
    return item.agent || agent;
  }
  function setStatus(text) {
    status.textContent = text;
    root.setAttribute("data-status", text);
  }

  // ---- sending ----
  function newId() {
    if (window.crypto && crypto.randomUUID) return crypto.randomUUID();
    return "w" + Date.now().toString(36) + Math.random().toString(36).slice(2);
  }
  async function submit() {
    var text = input.value.trim();
    var chosen = Array.prototype.slice.call(fileInput.files || []);
    if (!text && !chosen.length) return;
    if (!token) {
      setStatus("Not signed in");
      return;
    }
    input.value = "";
    var item = { kind: "me", id: newId(), text: text, accepted: false, files: [], uploads: [] };
    chosen.forEach(function (f) {
      item.files.push(f.name);
    });
    state.items.push(item);
    save();
    render();
    try {
      for (var i = 0; i < chosen.length; i++) item.uploads.push(await upload(chosen[i], item.id + "-" + i));
    } catch (e) {
      item.text = item.text + " (" + e.message + ")";
      state.items = state.items.filter(function (x) {
        return x !== item;
      });
      save();
      render();
      setStatus(e.message);
      return;
    }
    fileInput.value = "";
    files.textContent = "";
    save();
    transmit(item);
  }
  async function upload(file, key) {
    var res = await fetch(gateway + "/chat/uploads?name=" + encodeURIComponent(file.name), {
      method: "POST",
      headers: {
        Authorization: "Bearer " + token,
        "Content-Type": file.type || "application/octet-stream",
        "Idempotency-Key": key,
      },
      body: file,
    });
    var body = await res.json().catch(function () {
      return {};
    });
    if (!res.ok) throw new Error("upload of " + file.name + " refused: " + ((body.error && body.error.message) || res.status));
    return body.upload_id;
  }
  function transmit(item) {
    if (!socket || socket.readyState !== WebSocket.OPEN) return; // sent on the next connection
    socket.send(
      JSON.stringify({ type: "message", id: item.id, agent: agent, text: item.text, attachments: item.uploads || [] })
    );
  }

  // ---- the socket ----
  async function freshToken() {
    if (!cfg.tokenUrl) return token;
    var res = await fetch(cfg.tokenUrl, { credentials: "include" });
    if (!res.ok) throw new Error("token " + res.status);
    var text = await res.text();
    try {
      return JSON.parse(text).token || text.trim();
    } catch (e) {
      return text.trim();
    }
  }
  async function connect() {
    clearTimeout(retryTimer);
    if (stopped) return;
    try {
      var t = await freshToken();
      if (t && t !== token) {
        token = t;
        load();
        render();
      }
    } catch (e) {
      setStatus("Could not sign in; retrying");
      return retry();
    }
    if (!token) {
      setStatus("Not signed in");
      return;
    }
    var url = wsBase + "/ws/chat/" + encodeURIComponent(channel) + "?token=" + encodeURIComponent(token);
    if (state.lastSeq > 0) url += "&since=" + state.lastSeq;
    setStatus(connectedOnce ? "Reconnecting\u2026" : "Connecting\u2026");
    var ws = new WebSocket(url);
    socket = ws;
    var heard = Date.now();
    var pinged = 0;
    clearInterval(heartbeat);
    heartbeat = setInterval(function () {
      if (socket !== ws) return;
      var silent = Date.now() - heard;
      if (ws.readyState !== WebSocket.OPEN || (pinged && silent >= HEARTBEAT_MS)) {
        if (ws.readyState === WebSocket.OPEN || silent >= HEARTBEAT_MS) abandon(ws);
        return;
      }
      if (silent >= HEARTBEAT_MS / 2 && !pinged) {
        pinged = Date.now();
        ws.send(JSON.stringify({ type: "ping", id: String(pinged) }));
      }
    }, Math.max(250, HEARTBEAT_MS / 4));
    ws.onopen = function () {
      retryMs = 500;
      heard = Date.now();
      connectedOnce = true;
      setStatus("Connected");
      state.items.forEach(function (item) {
        if (item.kind === "me" && !item.accepted) transmit(item);
      });
    };
    ws.onmessage = function (ev) {
      heard = Date.now();
      pinged = 0;
      var frame;
      try {
        frame = JSON.parse(ev.data);
      } catch (e) {
        return;
      }
      receive(frame);
    };
    ws.onclose = function (ev) {
      if (socket !== ws) return;
      // 4001: the gateway closed the socket at the token's expiry. A token URL gives a fresh
      // one on the next connection; a fixed token waits for setToken().
      if (ev && ev.code === 4001 && !cfg.tokenUrl) {
        clearInterval(heartbeat);
        socket = null;
        token = null;
        setStatus("Signed out: the sign-in expired");
        return;
      }
      setStatus("Disconnected; reconnecting\u2026");
      retry();
    };
  }
  // Give up on a socket that stopped answering: it is closed without waiting for its close
  // handshake (which a dead network never completes) and a new one is made.
  function abandon(ws) {
    if (socket !== ws) return;
    clearInterval(heartbeat);
    socket = null;
    try {
      ws.close();
    } catch (e) {
      /* already closing */
    }
    setStatus("No answer; reconnecting\u2026");
    retry();
  }

  function retry() {
    clearTimeout(retryTimer);
    var wait = retryMs * (0.75 + Math.random() / 2);
    retryMs = Math.min(retryMs * 2, 10000);
    retryTimer = setTimeout(connect, wait);
  }
  window.addEventListener("online", function () {
    if (!socket || socket.readyState !== WebSocket.OPEN) connect();
  });

  function receive(frame) {
    if (frame.type === "accepted") {
      state.items.forEach(function (item) {
        if (item.kind === "me" && item.id === frame.id) item.accepted = true;
      });
    } else if (frame.type === "reply" || frame.type === "notice") {
      var seen = state.items.some(function (item) {
        return item.id === frame.reply_id && item.kind !== "me";
      });
      if (!seen) {
        state.items.push({
          kind: frame.type,
          id: frame.reply_id,
          text: frame.text,
          agent: frame.agent,
          inReplyTo: frame.in_reply_to,
          at: frame.sent_at,
        });
      }
      if (frame.seq > state.lastSeq) state.lastSeq = frame.seq;
    } else if (frame.type === "pong") {
      return;
    } else if (frame.type === "error") {
      setStatus(frame.message || frame.code);
      if (frame.id) {
        state.items.forEach(function (item) {
          if (item.id === frame.id) {
            item.accepted = true;
            item.text += " (not sent: " + (frame.message || frame.code) + ")";
          }
        });
      }
    } else {
      return;
    }
    save();
    render();
  }

  window.SwitchboardWidget = {
    open: open,
    close: hide,
    setToken: function (jwt) {
      token = jwt;
      load();
      render();
      if (socket) socket.close();
      else connect();
    },
    /** The transcript as shown: [{kind, id, text, ...}]. */
    transcript: function () {
      return JSON.parse(JSON.stringify(state.items));
    },
  };

  function start() {
    document.body.appendChild(root);
    load();
    render();
    if (cfg.open === "true") open();
    if (token || cfg.tokenUrl) connect();
    else setStatus("Not signed in");
  }
  if (document.body) start();
  else document.addEventListener("DOMContentLoaded", start);
})();
