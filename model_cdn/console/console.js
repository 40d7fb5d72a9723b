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
    headers: { ...((options || {}).headers || {}), Authorization: "Bearer " + key },
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
// A report's figure as written: whole numbers whole, others to 4 significant digits.
const figure = (x) => (typeof x !== "number" ? String(x) : Number.isInteger(x)
  ? x.toLocaleString("en") : String(Number(x.toPrecision(4))));
const num = (x, digits = 3) => (typeof x === "number" ? x.toFixed(digits) : "—");
const ago = (t) => {
  if (typeof t !== "number" || t <= 0) return "never";
  const s = Math.max(0, Date.now() / 1000 - t);
  return s < 90 ? `${s.toFixed(0)} s ago` : s < 5400 ? `${(s / 60).toFixed(0)} min ago`
    : `${(s / 3600).toFixed(1)} h ago`;
};
const pill = (text) => el("span", { class: `pill ${text}`, text });

// A cell whose text may be long (a reason, a report, a list): it wraps instead of
// widening the table past the page.
// ``short``: a list that is usually one word ("—"), so it needs little room.
class Wrapped { constructor(text, short) { this.text = text; this.short = short; } }
const wrap = (text, short) => new Wrapped(text, short);

function table(columns, rows, id, cls) {
  const head = el("tr", {}, ...columns.map((c) => el("th", { text: c })));
  const body = rows.map((cells) => el("tr", {}, ...cells.map((c) =>
    c instanceof Node ? el("td", {}, c)
      : c instanceof Wrapped ? el("td", { class: c.short ? "wrap short" : "wrap", text: c.text })
        : el("td", { class: typeof c === "number" ? "num" : null, text: c }))));
  return el("table", { id, class: cls }, el("thead", {}, head), el("tbody", {}, ...body));
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

// The fleet page asks the server for one page of devices at a time (the fleet may hold
// 10,000): the filter box and the page live in the hash (#/fleet?q=…&offset=…), so a
// link or a reload shows the same page. The filter box is built once and kept across
// the two-second refreshes, so typing in it is never interrupted.
const PAGE_SIZES = [25, 50, 100, 200];
const FILTER_HELP = "words match a device's id, labels and models; site=factory-a: a label; " +
  "model:NAME, version:N, status:online|offline|never narrow further";
let fleetFilter = null;

function fleetQuery() {
  const query = new URLSearchParams((location.hash.split("?")[1]) || "");
  const size = Number(query.get("limit"));
  return { text: query.get("filter") || "", offset: Math.max(0, Number(query.get("offset")) || 0),
    limit: PAGE_SIZES.includes(size) ? size : 50 };
}

function setFleetQuery(q) {
  const query = new URLSearchParams();
  if (q.text) query.set("filter", q.text);
  if (q.offset) query.set("offset", String(q.offset));
  if (q.limit !== 50) query.set("limit", String(q.limit));
  const hash = "#/fleet" + (query.toString() ? "?" + query : "");
  if (hash !== location.hash) { history.replaceState(null, "", hash); render(); }
}

// The filter box's text as the devices API's parameters.
function filterParams(text) {
  const params = new URLSearchParams();
  const words = [];
  for (const token of text.trim().split(/\s+/).filter(Boolean)) {
    const colon = /^(model|version|status):(.*)$/.exec(token);
    if (colon) params.set(colon[1], colon[2]);
    else if (/^[^=]+=[^=]+$/.test(token)) params.append("label", token);
    else words.push(token);
  }
  if (words.length) params.set("q", words.join(" "));
  return params;
}

function filterBox() {
  if (fleetFilter) return fleetFilter;
  const input = el("input", { id: "filter", type: "search", autocomplete: "off",
    placeholder: "filter: site=factory-a status:online …", "aria-describedby": "filter-help" });
  const size = el("select", { id: "page-size", "aria-label": "devices per page" },
    ...PAGE_SIZES.map((n) => el("option", { value: n, text: `${n} a page` })));
  let pending = null;
  input.addEventListener("input", () => {
    clearTimeout(pending);
    pending = setTimeout(() => setFleetQuery({ ...fleetQuery(), text: input.value, offset: 0 }),
      250);
  });
  size.addEventListener("change", () => setFleetQuery({ ...fleetQuery(), limit: Number(size.value),
    offset: 0 }));
  fleetFilter = el("div", { class: "filter", id: "fleet-filter" }, input, size,
    el("div", { class: "muted", id: "filter-help", text: FILTER_HELP }));
  return fleetFilter;
}

async function fleetPage() {
  const q = fleetQuery();
  const params = filterParams(q.text);
  params.set("offset", String(q.offset));
  params.set("limit", String(q.limit));
  const box = filterBox();
  const input = box.querySelector("#filter");
  if (document.activeElement !== input && input.value !== q.text) input.value = q.text;
  box.querySelector("#page-size").value = String(q.limit);
  const overview = await api("/console/api/overview");
  let devices, problem = null;
  try {
    devices = await api("/console/api/devices?" + params);
  } catch (e) {
    if (e.status !== 400) throw e;
    devices = { devices: [], total: 0, fleet: overview.devices, offset: 0, limit: q.limit };
    problem = e.message; // the filter box's text, refused: say why, under the box
  }
  const cards = el("div", { class: "cards" },
    card(overview.devices, "devices"), card(overview.online, "online"),
    card(Object.keys(overview.sites).length, "sites"),
    card(overview.rollouts.filter((r) => ACTIVE.includes(r.state)).length, "active rollouts"));
  const sites = table(["site", "devices", "online", "models and versions"],
    Object.entries(overview.sites).map(([site, s]) => [site, s.devices, s.online,
      wrap(Object.entries(s.versions).map(([v, n]) => `${v}: ${n}`).join(" · "))]), "sites");
  const rows = devices.devices.map((d) => {
    const t = d.telemetry || {};
    return [d.device, wrap(labels(d.labels) + (d.labels_differ ? " (claims differ)" : "")),
      wrap(Object.entries(d.models).map(([m, v]) => `${m}@${v}`).join(" ")),
      d.online ? "yes" : "no", ago(d.last_seen),
      t.requests ? pct(t.offloads / t.requests) : "—",
      t.agreement_samples ? pct(t.agreed / t.agreement_samples) : "—",
      t.requests ? pct(t.errors / t.requests, 2) : "—"];
  });
  const first = devices.total ? devices.offset + 1 : 0;
  const last = devices.offset + devices.devices.length;
  const n = (x) => x.toLocaleString("en");
  const summary = devices.total
    ? `${n(first)}–${n(last)} of ${n(devices.total)}` +
      (devices.total < devices.fleet ? ` matching (fleet: ${n(devices.fleet)})` : "")
    : (q.text ? `none of ${n(devices.fleet)} match` : "none yet");
  const pager = el("div", { class: "pager" },
    el("button", { type: "button", id: "page-prev", disabled: devices.offset <= 0,
      onclick: () => setFleetQuery({ ...q, offset: Math.max(0, devices.offset - q.limit) }) },
    "← previous"),
    el("span", { id: "page-summary", text: `Devices ${summary}` }),
    el("button", { type: "button", id: "page-next", disabled: last >= devices.total,
      onclick: () => setFleetQuery({ ...q, offset: devices.offset + q.limit }) }, "next →"));
  return [el("h2", { text: "Fleet" }), cards, el("h3", { text: "By site" }), sites,
    el("h3", { text: "Devices" }), box,
    problem ? el("p", { class: "error", id: "filter-error", text: problem }) : null, pager,
    table(["device", "labels (operator's)", "models", "online", "last seen", "offloads",
      "agreement", "errors"], rows, "devices", "fit")].filter(Boolean);
}

const ACTIVE = ["pending", "running", "paused", "halted", "rolling_back"];
const card = (n, label) => el("div", { class: "card" }, el("div", { class: "n",
  text: typeof n === "number" ? n.toLocaleString("en") : n }),
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
    `${r.counts.installed} / ${r.counts.total}`, wrap((r.waiting || []).join("; ") || r.reason || "")]);
  return [el("h2", { text: "Rollouts" }),
    rows.length ? table(["id", "model", "versions", "state", "wave", "installed", "now"], rows,
      "rollouts", "fit") : el("p", { class: "muted", text: "No rollouts yet." })];
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
  bar.append(skipGateButton(status));
  return bar;
}

// Skip gate (issue 21): the operator's explicit, confirmed and recorded way past a wave's
// health judgement; resume goes on judging. The reason goes into the rollout's history.
function skipGateButton(status) {
  return el("button", {
    type: "button", id: "action-skip-gate", class: "danger",
    disabled: !["running", "paused", "halted"].includes(status.state),
    onclick: async () => {
      const reason = el("input", { id: "skip-reason", type: "text", maxlength: 500,
        placeholder: "reason (required; kept in the rollout's history)" });
      document.getElementById("confirm-text").after(reason);
      let ok = false;
      try {
        ok = await confirmAction(`Skip the health gate of wave ${status.wave + 1} of ${status.id}` +
          ` (${status.model} ${status.previous_version} → ${status.version})? The wave goes on` +
          " without its judgement; this is recorded with your reason.");
      } finally {
        reason.remove();
      }
      if (!ok) return;
      try {
        await api(`/console/api/rollouts/${status.id}/skip-gate`, { method: "POST",
          headers: { "Content-Type": "application/json" },
          body: JSON.stringify({ confirm: true, reason: reason.value.trim() }) });
      } catch (e) {
        alertLine(e.message);
      }
      render();
    },
  }, "skip gate");
}

function alertLine(text) {
  const line = el("p", { class: "error", id: "action-error", text });
  document.getElementById("main").prepend(line);
}

// What a gate's chart plots, in words: the judgement's "worse by" (its delta), which is
// new − control for a rate where higher is worse (errors), control − new where lower is
// worse (agreement), in percentage points; new ÷ control for latency (a ratio).
function plotted(j) {
  if (j.scale === "ratio") {
    return { axis: "new ÷ control (ratio)", what: `${j.metric}: new ÷ control, 1 = the same`,
      unit: (v) => "×" + v.toFixed(2) };
  }
  const diff = j.higher_is_worse ? "new − control" : "control − new";
  return { axis: "percentage points", what: `${j.metric}: ${diff}, in percentage points ` +
    "(above 0: the new version is worse)",
    unit: (v) => (v > 0 ? "+" : v < 0 ? "−" : "") + Math.abs(v).toFixed(1) + " pts" };
}

function chart(j, history) {
  const metric = j.metric, margin = j.margin, scale = j.scale, how = plotted(j);
  const points = history.filter((h) => h.metrics && h.metrics[metric] &&
    typeof h.metrics[metric][0] === "number");
  const width = 460, height = 190, left = 70, right = 12, top = 22, bottom = 30;
  const box = svg("svg", { width, height, viewBox: `0 0 ${width} ${height}`, class: "plot",
    "data-metric": metric, role: "img", "aria-label": how.what });
  const text = (x, y, words, anchor) => {
    const t = svg("text", { x, y, "text-anchor": anchor || "start" });
    t.textContent = words;
    box.append(t);
    return t;
  };
  text(4, 12, how.axis).setAttribute("class", "axis");
  if (!points.length) {
    text(left, height / 2, "no evidence yet");
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
  // value labels: the axis's ends, no difference, the margin (each in its unit)
  const used = [];
  for (const v of [base, margin * k, hi - pad, lo + pad]) {
    if (used.some((u) => Math.abs(y(u) - y(v)) < 11)) continue;
    used.push(v);
    text(left - 6, y(v) + 4, how.unit(v), "end").setAttribute("class", "tick");
  }
  text(left, height - 16, "0 s");
  text(width - right, height - 16, `${(t1 - t0).toFixed(0)} s`, "end");
  text((left + width - right) / 2, height - 4, "seconds since the first point shown", "middle");
  return box;
}

function chartLegend(j) {
  const conf = `${(j.confidence * 100).toFixed(2)}%`;
  return el("div", { class: "legend", text: `${plotted(j).what}. Line: the estimate; band: its ` +
    `${conf} interval; grey: no difference; dashed red: the margin ` +
    `(${j.scale === "ratio" ? num(j.margin) : pts(j.margin) + " pts"}); dots: looks.` });
}

// Both cohorts, counted once on the server (gates.cohorts): the header says how many
// devices each holds and how many counted; the table's "devices counted" reads the same.
function cohortText(c, name) {
  if (!c) return `${name}: —`;
  const counted = !c.counted ? "none judged yet"
    : c.counted[0] === c.counted[1] ? `${c.counted[1]} counted`
      : `${c.counted[0]}–${c.counted[1]} counted, by gate`;
  const why = [];
  if (c.excluded.length) {
    why.push(`${c.excluded.length} excluded as ${c.excluded.length > 1 ? "outliers" : "an outlier"}` +
      `: ${c.excluded.join(", ")}`);
  }
  if (c.flagged.length) why.push(`${c.flagged.length} flagged: ${c.flagged.join(", ")}`);
  const silent = c.counted ? c.devices - c.counted[1] - c.excluded.length - c.flagged.length : 0;
  if (silent > 0) why.push(`${silent} with nothing counted yet`);
  return `${name} ${c.devices} device${c.devices === 1 ? "" : "s"}, ${counted}` +
    (why.length ? ` (${why.join("; ")})` : "");
}

const cohortLine = (cs) => (cs ? cohortText(cs.new, "new version:") + "; " +
  cohortText(cs.control, "control, kept on the previous version:") : "");

const counted = (j, cs) => (cs ? `${j.new.devices} of ${cs.new.devices} / ` +
  `${j.control.devices} of ${cs.control.devices}` : `${j.new.devices} / ${j.control.devices}`);

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
      `${(j.confidence * 100).toFixed(2)}%`, wrap(counted(j, g.cohorts), true),
      `${Math.round(j.new.samples)} / ${Math.round(j.control.samples)}`,
      wrap([...j.new.excluded, ...j.control.excluded].join(" ") || "—", true), wrap(j.why)];
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
      el("p", { class: "muted", id: "cohorts", text: `look ${g.looks.done} of ${g.looks.total}; ` +
        cohortLine(g.cohorts) + ". Worse by: how much worse the new version does than the " +
        "control, in percentage points (a ratio for latency)" }));
    if (judgements.length) {
      parts.push(table(["gate", "verdict", "new", "control", "worse by", "interval", "allowed",
        "confidence", "devices counted n/c", "samples n/c", "outliers", "why"], judgements,
        "judgements", "fit"));
      parts.push(el("div", { class: "charts" }, ...(g.judgements || []).map((j) =>
        el("div", { class: "chart" }, el("div", { class: "title", text: `${j.metric}: how much ` +
          "worse the new version is, over time" }), chart(j, g.history || []), chartLegend(j)))));
    }
    const flagged = Object.entries(g.flagged || {});
    if (flagged.length) {
      parts.push(el("h3", { text: "Telemetry not counted" }),
        table(["device", "why"], flagged.map(([d, why]) => [d, wrap(why)]), "flagged", "fit"));
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
      wrap((v.manifest.deltas || []).map((d) => `from ${d.from_version ?? d.base_version ?? "?"}: ` +
        `${d.size ?? "?"} B`).join("; ") || "—"),
      wrap(Object.entries(q).map(([k, x]) => `${k}=${figure(x)}`).join(" ") || "—"),
      v.blob_digest.slice(0, 19) + "…"];
  });
  return [el("h2", { text: `Model ${m.name}` }),
    table(["version", "published", "raw bytes", "served bytes", "compression", "deltas",
      "quantization report", "blob"], rows, "versions", "fit")];
}

// -- routing ---------------------------------------------------------------------------

async function render() {
  if (!who) return;
  const mine = ++generation;
  const [, page, arg] = (location.hash || "#/fleet").split("?")[0].split("/");
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
  if (document.getElementById("confirm").hidden) place(main, parts);
}

// Put ``parts`` in ``main``, leaving in place a node that is there already (the fleet's
// filter box: replacing it would take the focus and the caret from someone typing).
function place(main, parts) {
  if (!parts.some((p) => p.parentNode === main)) { main.replaceChildren(...parts); return; }
  for (const child of [...main.childNodes]) if (!parts.includes(child)) child.remove();
  let before = null;
  for (const p of parts) {
    if (p.parentNode !== main || p.previousSibling !== before) {
      if (before) before.after(p); else main.prepend(p);
    }
    before = p;
  }
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
