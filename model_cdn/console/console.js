// The Tandem fleet console: plain JavaScript, no build step, no outside requests.
// Pages: #/fleet, #/rollouts, #/rollouts/<id>, #/models, #/models/<name>. Every page
// polls its JSON every two seconds. Text from the server is only ever set as text
// (textContent), never parsed as HTML.
"use strict";

const POLL_MS = 2000;
const SVG = "http://www.w3.org/2000/svg";
let key = sessionStorage.getItem("tandem-key") || "";
let who = null;
let timer = null;
let generation = 0;

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (name === "text") node.textContent = String(value);
    else if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else node.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function svg(tag, attrs) {
  const node = document.createElementNS(SVG, tag);
  for (const [name, value] of Object.entries(attrs || {})) node.setAttribute(name, String(value));
  return node;
}

async function api(path, options) {
  const response = await fetch(path, {
    ...(options || {}),
    headers: { Authorization: "Bearer " + key },
  });
  let body = {};
  try { body = await response.json(); } catch (e) { body = {}; }
  if (!response.ok) {
    const error = new Error(body.error || response.statusText);
    error.status = response.status;
    throw error;
  }
  return body;
}

const pct = (x, digits = 1) => (typeof x === "number" ? (x * 100).toFixed(digits) + "%" : "—");
const pts = (x) => (typeof x === "number" ? (x >= 0 ? "+" : "") + (x * 100).toFixed(2) : "—");
const num = (x, digits = 3) => (typeof x === "number" ? x.toFixed(digits) : "—");
const ago = (t) => {
  if (typeof t !== "number" || t <= 0) return "never";
  const s = Math.max(0, Date.now() / 1000 - t);
  return s < 90 ? `${s.toFixed(0)} s ago` : s < 5400 ? `${(s / 60).toFixed(0)} min ago`
    : `${(s / 3600).toFixed(1)} h ago`;
};
const pill = (text) => el("span", { class: `pill ${text}`, text });

function table(columns, rows, id) {
  const head = el("tr", {}, ...columns.map((c) => el("th", { text: c })));
  const body = rows.map((cells) => el("tr", {}, ...cells.map((c) =>
    c instanceof Node ? el("td", {}, c)
      : el("td", { class: typeof c === "number" ? "num" : null, text: c }))));
  return el("table", { id }, el("thead", {}, head), el("tbody", {}, ...body));
}

// -- sign in ---------------------------------------------------------------------------

function showLogin(message) {
  document.getElementById("main").replaceChildren();
  document.getElementById("login").hidden = false;
  document.getElementById("logout").hidden = true;
  document.getElementById("who").textContent = "";
  document.getElementById("login-error").textContent = message || "";
}

async function signIn(text) {
  key = text.trim();
  try {
    who = await api("/console/api/whoami");
  } catch (e) {
    key = "";
    sessionStorage.removeItem("tandem-key");
    showLogin(e.status === 401 || e.status === 403 ? "That key is not accepted here." : e.message);
    return false;
  }
  sessionStorage.setItem("tandem-key", key);
  document.getElementById("login").hidden = true;
  document.getElementById("logout").hidden = false;
  document.getElementById("who").textContent = who.act ? "can act (rollout:admin)" : "read-only";
  return true;
}

// -- confirmation ----------------------------------------------------------------------

function confirmAction(text) {
  const box = document.getElementById("confirm");
  document.getElementById("confirm-text").textContent = text;
  box.hidden = false;
  return new Promise((resolve) => {
    const done = (answer) => {
      box.hidden = true;
      ok.removeEventListener("click", yes);
      cancel.removeEventListener("click", no);
      resolve(answer);
    };
    const ok = document.getElementById("confirm-ok");
    const cancel = document.getElementById("confirm-cancel");
    const yes = () => done(true);
    const no = () => done(false);
    ok.addEventListener("click", yes);
    cancel.addEventListener("click", no);
  });
}

// -- pages -----------------------------------------------------------------------------

async function fleetPage() {
  const [overview, devices] = await Promise.all([
    api("/console/api/overview"), api("/console/api/devices"),
  ]);
  const cards = el("div", { class: "cards" },
    card(overview.devices, "devices"), card(overview.online, "online"),
    card(Object.keys(overview.sites).length, "sites"),
    card(overview.rollouts.filter((r) => ACTIVE.includes(r.state)).length, "active rollouts"));
  const sites = table(["site", "devices", "online", "models and versions"],
    Object.entries(overview.sites).map(([site, s]) => [site, s.devices, s.online,
      Object.entries(s.versions).map(([v, n]) => `${v}: ${n}`).join("  ")]), "sites");
  const shown = devices.devices.slice(0, 300);
  const rows = shown.map((d) => {
    const t = d.telemetry || {};
    return [d.device, labels(d.labels) + (d.labels_differ ? " (claims differ)" : ""),
      Object.entries(d.models).map(([m, v]) => `${m}@${v}`).join(" "),
      d.online ? "yes" : "no", ago(d.last_seen),
      t.requests ? pct(t.offloads / t.requests) : "—",
      t.agreement_samples ? pct(t.agreed / t.agreement_samples) : "—",
      t.requests ? pct(t.errors / t.requests, 2) : "—"];
  });
  return [el("h2", { text: "Fleet" }), cards, el("h3", { text: "By site" }), sites,
    el("h3", { text: `Devices (${devices.devices.length}${shown.length < devices.devices.length
      ? ", first 300 shown" : ""})` }),
    table(["device", "labels (operator's)", "models", "online", "last seen", "offloads",
      "agreement", "errors"], rows, "devices")];
}

const ACTIVE = ["pending", "running", "paused", "halted", "rolling_back"];
const card = (n, label) => el("div", { class: "card" }, el("div", { class: "n", text: n }),
  el("div", { class: "l", text: label }));
const labels = (m) => Object.entries(m || {}).sort().map(([k, v]) => `${k}=${v}`).join(",") || "—";

async function rolloutsPage() {
  const overview = await api("/console/api/overview");
  if (!overview.rollouts_enabled) {
    return [el("h2", { text: "Rollouts" }),
      el("p", { class: "muted", text: "Rollouts are off: start the CDN with --broker and --sign-key." })];
  }
  const rows = overview.rollouts.map((r) => [
    el("a", { href: `#/rollouts/${r.id}`, text: r.id }), r.model,
    `${r.previous_version} → ${r.version}`, pill(r.state),
    r.wave >= 0 ? `${r.wave + 1} / ${r.waves_total}` : "—",
    `${r.counts.installed} / ${r.counts.total}`, (r.waiting || []).join("; ") || r.reason || ""]);
  return [el("h2", { text: "Rollouts" }),
    rows.length ? table(["id", "model", "versions", "state", "wave", "installed", "now"], rows,
      "rollouts") : el("p", { class: "muted", text: "No rollouts yet." })];
}

function actions(status) {
  const allowed = {
    pause: ["running"], resume: ["paused", "halted"],
    abort: ["pending", "running", "paused", "halted"],
    rollback: ["running", "paused", "halted", "completed", "aborted"],
  };
  if (!who || !who.act) {
    return el("p", { class: "muted", id: "read-only",
      text: "Read-only key: pausing, resuming, aborting and rolling back need rollout:admin." });
  }
  const bar = el("div", { class: "actions" });
  for (const [verb, states] of Object.entries(allowed)) {
    bar.append(el("button", {
      type: "button", id: `action-${verb}`, class: verb === "abort" || verb === "rollback"
        ? "danger" : null, disabled: !states.includes(status.state),
      onclick: async () => {
        if (!(await confirmAction(`${verb[0].toUpperCase() + verb.slice(1)} rollout ${status.id}` +
          ` (${status.model} ${status.previous_version} → ${status.version})?`))) return;
        try {
          await api(`/console/api/rollouts/${status.id}/${verb}`, { method: "POST" });
        } catch (e) {
          alertLine(e.message);
        }
        render();
      },
    }, verb));
  }
  return bar;
}

function alertLine(text) {
  const line = el("p", { class: "error", id: "action-error", text });
  document.getElementById("main").prepend(line);
}

function chart(metric, history, margin, scale) {
  const points = history.filter((h) => h.metrics && h.metrics[metric] &&
    typeof h.metrics[metric][0] === "number");
  const width = 420, height = 170, left = 46, right = 10, top = 10, bottom = 24;
  const box = svg("svg", { width, height, viewBox: `0 0 ${width} ${height}`, class: "plot",
    "data-metric": metric });
  if (!points.length) {
    const t = svg("text", { x: left, y: height / 2 });
    t.textContent = "no evidence yet";
    box.append(t);
    return box;
  }
  const k = scale === "ratio" ? 1 : 100;
  const t0 = points[0].at, t1 = Math.max(points[points.length - 1].at, t0 + 1);
  const ys = points.flatMap((p) => [p.metrics[metric][1], p.metrics[metric][2]]).map((v) => v * k);
  const base = scale === "ratio" ? 1 : 0;
  let lo = Math.min(...ys, base, margin * k), hi = Math.max(...ys, base, margin * k);
  const pad = (hi - lo) * 0.08 || 1;
  lo -= pad; hi += pad;
  const x = (t) => left + ((t - t0) / (t1 - t0)) * (width - left - right);
  const y = (v) => top + (1 - (v - lo) / (hi - lo)) * (height - top - bottom);
  const upper = points.map((p) => `${x(p.at)},${y(p.metrics[metric][2] * k)}`);
  const lower = points.slice().reverse().map((p) => `${x(p.at)},${y(p.metrics[metric][1] * k)}`);
  box.append(svg("polygon", { points: upper.concat(lower).join(" "), fill: "#0b5cad",
    "fill-opacity": 0.15 }));
  box.append(svg("line", { x1: left, x2: width - right, y1: y(base), y2: y(base),
    stroke: "#98a2b3" }));
  box.append(svg("line", { x1: left, x2: width - right, y1: y(margin * k), y2: y(margin * k),
    stroke: "#cf222e", "stroke-dasharray": "5 4", class: "margin" }));
  box.append(svg("polyline", { points: points.map((p) => `${x(p.at)},${y(p.metrics[metric][0] * k)}`)
    .join(" "), fill: "none", stroke: "#0b5cad", "stroke-width": 2 }));
  for (const p of points.filter((q) => q.look)) {
    const colour = { pass: "#1a7f37", fail: "#cf222e" }[p.metrics[metric][3]] || "#9a6700";
    box.append(svg("circle", { cx: x(p.at), cy: y(p.metrics[metric][0] * k), r: 4, fill: colour,
      class: "look" }));
  }
  for (const [v, label] of [[lo + pad, (lo + pad).toFixed(1)], [hi - pad, (hi - pad).toFixed(1)]]) {
    const t = svg("text", { x: 4, y: y(v) + 4 });
    t.textContent = label;
    box.append(t);
  }
  const caption = svg("text", { x: left, y: height - 6 });
  caption.textContent = `${((t1 - t0)).toFixed(0)} s · band: interval · dashed: margin · dots: looks`;
  box.append(caption);
  return box;
}

async function rolloutPage(id) {
  const s = await api(`/console/api/rollouts/${encodeURIComponent(id)}`);
  const g = s.gates || {};
  const waves = table(["wave", "planned", "installed", "failed", "timed out", "in progress"],
    (s.waves || []).map((w) => [w.index + 1, w.planned, w.installed, w.failed, w.timed_out,
      w.assigned + w.queued]), "waves");
  const judgements = (g.judgements || []).map((j) => {
    const ratio = j.scale === "ratio";
    const f = ratio ? num : pts;
    const est = (side) => (typeof side.estimate === "number"
      ? (ratio ? `${side.estimate.toFixed(1)} ms` : pct(side.estimate, 2)) : "—");
    return [j.metric, pill(j.verdict), est(j.new), est(j.control), f(j.delta),
      `[${f(j.lower)}, ${f(j.upper)}]`, (ratio ? "≤ " + num(j.margin) : "≤ " + pts(j.margin)),
      `${(j.confidence * 100).toFixed(2)}%`, `${j.new.devices} / ${j.control.devices}`,
      `${Math.round(j.new.samples)} / ${Math.round(j.control.samples)}`,
      [...j.new.excluded, ...j.control.excluded].join(" ") || "—", j.why];
  });
  const parts = [
    el("h2", { text: `Rollout ${s.id}` }),
    el("p", {}, `${s.model} ${s.previous_version} → ${s.version} on `,
      labels(s.target) === "—" ? "every device" : labels(s.target), " · ", pill(s.state),
      s.wave >= 0 ? ` wave ${s.wave + 1} of ${s.waves_total}` : "",
      s.reason && !s.reason.startsWith("wave ") ? ` · ${s.reason}` : ""),
    actions(s),
    el("h3", { text: "Waves" }), waves,
  ];
  if ((s.waiting || []).length) {
    parts.push(el("h3", { text: "Why the wave waits" }),
      el("ul", { class: "waiting", id: "waiting" }, ...s.waiting.map((w) => el("li", { text: w }))));
  }
  if (g.state && g.state !== "off") {
    parts.push(el("h3", { text: `Health gates: ${g.state}` }),
      el("p", { class: "muted", text: `look ${g.looks.done} of ${g.looks.total}; ` +
        `${g.new_devices} devices on the new version against ${g.control_devices} control ` +
        "devices kept on the previous one; change = new − control (points, or a ratio)" }));
    if (judgements.length) {
      parts.push(table(["gate", "verdict", "new", "control", "worse by", "interval", "allowed",
        "confidence", "devices n/c", "samples n/c", "outliers", "why"], judgements, "judgements"));
      parts.push(el("div", { class: "charts" }, ...(g.judgements || []).map((j) =>
        el("div", { class: "chart" }, el("div", { class: "title", text: `${j.metric} over time` }),
          chart(j.metric, g.history || [], j.margin, j.scale)))));
    }
    const flagged = Object.entries(g.flagged || {});
    if (flagged.length) {
      parts.push(el("h3", { text: "Telemetry not counted" }),
        table(["device", "why"], flagged, "flagged"));
    }
  }
  return parts;
}

async function modelsPage(name) {
  if (!name) {
    const overview = await api("/console/api/overview");
    return [el("h2", { text: "Models" }), table(["model", "versions"], overview.models.map((m) =>
      [el("a", { href: `#/models/${m.name}`, text: m.name }), m.versions.join(", ")]), "models")];
  }
  const m = await api(`/console/api/models/${encodeURIComponent(name)}`);
  const rows = m.versions.map((v) => {
    const b = v.manifest.blob || {};
    const q = v.manifest.quantization || {};
    return [v.version, v.published_at, b.raw_size, b.size, b.compression || "—",
      (v.manifest.deltas || []).map((d) => `from ${d.from_version ?? d.base_version ?? "?"}: ` +
        `${d.size ?? "?"} B`).join("; ") || "—",
      Object.entries(q).map(([k, x]) => `${k}=${typeof x === "number" ? num(x, 4) : x}`)
        .join(" ") || "—", v.blob_digest.slice(0, 19) + "…"];
  });
  return [el("h2", { text: `Model ${m.name}` }),
    table(["version", "published", "raw bytes", "served bytes", "compression", "deltas",
      "quantization report", "blob"], rows, "versions")];
}

// -- routing ---------------------------------------------------------------------------

async function render() {
  if (!who) return;
  const mine = ++generation;
  const [, page, arg] = (location.hash || "#/fleet").split("/");
  for (const a of document.querySelectorAll("header nav a")) {
    a.classList.toggle("active", a.id === `nav-${page}`);
  }
  let parts;
  try {
    if (page === "rollouts" && arg) parts = await rolloutPage(decodeURIComponent(arg));
    else if (page === "rollouts") parts = await rolloutsPage();
    else if (page === "models") parts = await modelsPage(arg && decodeURIComponent(arg));
    else parts = await fleetPage();
  } catch (e) {
    if (e.status === 401) { who = null; showLogin("Signed out: the key was refused."); return; }
    parts = [el("p", { class: "error", id: "page-error", text: e.message })];
  }
  if (mine !== generation) return; // a newer render started meanwhile
  const main = document.getElementById("main");
  if (document.getElementById("confirm").hidden) main.replaceChildren(...parts);
}

function poll() {
  clearInterval(timer);
  timer = setInterval(render, POLL_MS);
}

document.getElementById("login-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  if (await signIn(document.getElementById("key").value)) { render(); poll(); }
});
document.getElementById("logout").addEventListener("click", () => {
  sessionStorage.removeItem("tandem-key");
  key = ""; who = null; clearInterval(timer);
  showLogin("");
});
window.addEventListener("hashchange", render);

(async () => {
  if (key && (await signIn(key))) { render(); poll(); } else showLogin("");
})();
