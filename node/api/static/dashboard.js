// The node's dashboard: renders the snapshots that GET /v1/stream sends (server-sent
// events), with no page reload and nothing fetched from outside the node. Every value is
// put into the page as text (textContent), never as HTML.
"use strict";

const PALETTE = ["#4fb3ff", "#a78bfa", "#3fcf8e", "#f5b942", "#ff8fab", "#5eead4", "#fca5a5", "#c4b5fd"];
const HISTORY = 120; // samples of the machine's use kept for its chart
const machineHistory = [];
const lastCpu = {}; // agreement -> {cpu_us, at}: CPU in use is the rate between two snapshots
let snap = null;
let selected = null; // the job whose detail is open
let selectedSeen = null; // its updated_ms when the detail was last drawn

// -- small helpers -------------------------------------------------------------------------
const credits = (micro) => micro === null || micro === undefined ? "–"
  : (micro / 1e6).toLocaleString("en", { minimumFractionDigits: 2, maximumFractionDigits: 6 });
const cores = (milli) => `${(milli / 1000).toLocaleString("en", { maximumFractionDigits: 2 })} cores`;
function bytes(n) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return `${n.toLocaleString("en", { maximumFractionDigits: 1 })} ${units[i]}`;
}
const short = (id) => id ? (id.length > 16 ? `${id.slice(0, 8)}…${id.slice(-6)}` : id) : "–";
function ago(ms) {
  if (!ms || !snap) return "–";
  const s = Math.max(0, Math.round((snap.at_ms - ms) / 1000));
  if (s < 60) return `${s} s ago`;
  if (s < 3600) return `${Math.round(s / 60)} min ago`;
  return `${Math.round(s / 3600)} h ago`;
}
const clock = (ms) => new Date(ms).toLocaleTimeString("en-GB");
const badge = (state) => h("span", { class: `badge state-${state}`, "data-state": state }, state);

function fill(tbody, rows, empty, columns) {
  tbody.replaceChildren(...(rows.length ? rows : [h("tr", { class: "empty" }, h("td", { colspan: columns }, empty))]));
}

// -- rendering -------------------------------------------------------------------------------
function render() {
  const { node, jobs, market, ledger, peers } = snap;
  $("#node-peer-id").textContent = node.peer_id;
  $("#node-role").textContent = node.provider ? "provider" : "buyer";
  document.title = `${node.provider ? "provider" : "buyer"} ${short(node.peer_id)} · Compute Exchange`;
  $("#balance").textContent = credits(ledger.balance);
  $("#jobs-count").textContent = jobs.length;
  const counts = {};
  for (const j of jobs) counts[j.state] = (counts[j.state] || 0) + 1;
  $("#jobs-summary").textContent = Object.entries(counts).map(([s, n]) => `${n} ${s}`).join(" · ") || "none yet";
  $("#book-count").textContent = market.offers + market.bids;
  $("#book-summary").textContent = `${market.offers} offers · ${market.bids} bids`;
  $("#peers-count").textContent = peers.length;
  renderMachine();
  renderJobs(jobs);
  renderMarket(market, snap.offers);
  renderLedger(ledger);
  fill($("#peers tbody"), peers.map((p) => h("tr", {},
    h("td", {}, h("code", {}, p.peer_id)),
    h("td", { class: "num" }, p.score.toFixed(2)))), "no peers connected", 2);
}

function renderJobs(jobs) {
  fill($("#jobs tbody"), jobs.map((j) => h("tr", {
    "data-job-id": j.id, class: j.id === selected ? "selected" : "",
    onclick: () => select(j.id),
  },
    h("td", {}, h("code", {}, j.id.slice(0, 12))),
    h("td", {}, j.name || ""),
    h("td", {}, badge(j.state)),
    h("td", {}, j.provider ? h("code", {}, short(j.provider)) : "–"),
    h("td", { class: "num" }, credits(j.cost)),
    h("td", {}, ago(j.updated_ms)))), "no jobs yet: submit one with cx run", 6);
  const job = jobs.find((j) => j.id === selected);
  if (job && job.updated_ms !== selectedSeen) showJob(job);
}

function select(id) {
  selected = id;
  selectedSeen = null;
  renderJobs(snap.jobs);
}

async function getJson(path) {
  const answer = await fetch(path, { credentials: "same-origin", headers: { Accept: "application/json" } });
  if (answer.status === 401) { location.href = "/dashboard/login"; throw new Error("logged out"); }
  return answer.json();
}

async function showJob(job) {
  selectedSeen = job.updated_ms;
  const id = encodeURIComponent(job.id);
  const [events, logs] = await Promise.all([getJson(`/v1/jobs/${id}/events`), getJson(`/v1/jobs/${id}/logs`)]);
  if (job.id !== selected) return;
  const outputs = job.outputs.length
    ? h("table", { class: "grid" }, h("tbody", {}, job.outputs.map((o) => h("tr", {},
        h("td", {}, h("code", {}, o.path)), h("td", { class: "num" }, bytes(o.size)),
        h("td", {}, h("code", {}, o.url || o.digest.slice(0, 19)))))))
    : h("p", { class: "hint" }, "no outputs");
  $("#job-detail").replaceChildren(
    h("h3", {}, "Job ", h("code", {}, job.id)),
    h("p", {}, badge(job.state), " ", job.detail || ""),
    h("h3", {}, "Timeline"),
    h("ul", { class: "timeline", id: "job-timeline" }, events.map((e) => h("li", { "data-state": e.state },
      h("span", { class: "when" }, clock(e.at_ms)), badge(e.state), " ", e.detail))),
    h("h3", {}, "stdout"), h("pre", { class: "log", id: "job-stdout" }, logs.stdout || "(empty)"),
    h("h3", {}, "stderr"), h("pre", { class: "log" }, logs.stderr || "(empty)"),
    h("h3", {}, "Outputs"), outputs);
}

function priceChart(prices) {
  const box = svg("svg", { viewBox: "0 0 300 80", preserveAspectRatio: "none" });
  if (prices.length === 0) {
    const t = svg("text", { x: 150, y: 44, "text-anchor": "middle", fill: "#8593a3", "font-size": 12 });
    t.textContent = "no trades yet";
    box.append(t);
    return box;
  }
  const lo = Math.min(...prices), hi = Math.max(...prices), span = hi - lo;
  const step = prices.length > 1 ? 290 / (prices.length - 1) : 0;
  const y = (p) => span ? 70 - ((p - lo) / span) * 60 : 40; // one price: a level line
  const pts = prices.map((p, i) => `${prices.length > 1 ? 5 + i * step : 150},${y(p)}`);
  box.append(svg("polyline", { points: pts.join(" "), fill: "none", stroke: "#4fb3ff", "stroke-width": 2 }));
  for (const p of pts) { const [x, y] = p.split(","); box.append(svg("circle", { cx: x, cy: y, r: 3, fill: "#4fb3ff" })); }
  return box;
}

function renderMarket(market, offers) {
  const trades = {};
  for (const t of market.recent_trades) (trades[t.class] = trades[t.class] || []).push(t.cpu_core_hour);
  const classes = market.classes.length ? market.classes.map((c) => h("div", { class: "class-card", "data-class": c.class },
    h("div", { class: "title" }, c.class),
    h("div", { class: "facts" }, `${c.offers} offers · ${c.bids} bids · best ${credits(c.best_cpu_core_hour)}`
      + ` · last ${credits(c.last_cpu_core_hour)} / core-hour · ${c.volume} trades`),
    priceChart(trades[c.class] || c.last_prices)))
    : [h("p", { class: "hint" }, "The book is empty: no offers or bids seen yet.")];
  $("#classes").replaceChildren(...classes);
  fill($("#offers tbody"), offers.map((o) => h("tr", { "data-provider": o.provider },
    h("td", {}, h("code", {}, short(o.provider)), o.mine ? " (this node)" : ""),
    h("td", {}, o.class),
    h("td", {}, `${cores(o.cpu_milli)}, ${bytes(o.memory_bytes)}${o.gpus.length ? ", " + o.gpus.join(", ") : ""}`),
    h("td", {}, `${cores(o.free_cpu_milli)}, ${bytes(o.free_memory_bytes)}`),
    h("td", { class: "num" }, credits(o.cpu_core_hour)),
    h("td", { class: "num" }, credits(o.memory_gib_hour)),
    h("td", { class: "num" }, o.reputation),
    h("td", {}, o.trust.join(", ")))), "no live offers", 8);
}

function renderLedger(ledger) {
  const me = snap.node.peer_id;
  fill($("#ledger tbody"), [...ledger.entries].reverse().map((e) => h("tr", {},
    h("td", {}, h("code", {}, e.agreement_id.slice(0, 12))),
    h("td", {}, e.role),
    h("td", {}, h("code", {}, short(e.payer === me ? e.payee : e.payer))),
    h("td", { class: "num" }, `${e.role === "provider" ? "+" : "−"}${credits(e.amount)}`),
    h("td", {}, ago(e.at_ms)))), "no receipts settled yet", 5);
}

function renderMachine() {
  const p = snap.provider;
  $("#machine-card").hidden = !p;
  if (!p) return;
  $("#machine-class").textContent = p.class ? `offering ${p.class}` : "";
  for (const r of p.running) {
    const before = lastCpu[r.agreement_id];
    if (r.cpu_us !== null && before && snap.at_ms > before.at) {
      r.cores_used = (r.cpu_us - before.cpu_us) / 1000 / (snap.at_ms - before.at);
    }
    if (r.cpu_us !== null) lastCpu[r.agreement_id] = { cpu_us: r.cpu_us, at: snap.at_ms };
  }
  const used = (key) => p.running.reduce((n, r) => n + r[key], 0);
  const measured = (key) => p.running.reduce((n, r) => n + (r[key] || 0), 0);
  const rows = [["CPU", "cpu_milli", cores], ["Memory", "memory_bytes", bytes]];
  if (p.gpus) rows.push(["GPUs", "gpus", (n) => `${n} GPUs`]);
  $("#machine-bars").replaceChildren(...rows.map(([name, key, fmt]) => h("div", { class: "row", "data-resource": key },
    h("div", { class: "name" }, h("span", {}, name), h("span", {}, `${fmt(used(key))} of ${fmt(p[key])} reserved`)),
    h("div", { class: "bar" }, p.running.map((r, i) => h("div", {
      class: "seg", title: `job ${r.agreement_id.slice(0, 12)}: ${fmt(r[key])}`,
      style: `width:${(100 * r[key]) / (p[key] || 1)}%;background:${PALETTE[i % PALETTE.length]}`,
    }))))));
  fill($("#running tbody"), p.running.map((r, i) => h("tr", { "data-agreement": r.agreement_id },
    h("td", {}, h("code", { style: `color:${PALETTE[i % PALETTE.length]}` }, r.agreement_id.slice(0, 12))),
    h("td", {}, h("code", {}, short(r.buyer))), h("td", {}, badge(r.state)),
    h("td", {}, cores(r.cpu_milli)), h("td", {}, bytes(r.memory_bytes)), h("td", {}, r.gpus),
    h("td", { class: "cpu-used" }, r.cores_used === undefined ? "–" : cores(r.cores_used * 1000)),
    h("td", { class: "memory-peak" }, r.memory_peak_bytes === null ? "–" : bytes(r.memory_peak_bytes)),
    h("td", {}, r.started_ms ? ago(r.started_ms) : "–"))), "no jobs running here", 9);
  renderQuotas(snap.node.quotas);
  machineHistory.push({
    at: snap.at_ms,
    reserved: used("cpu_milli") / (p.cpu_milli || 1),
    cpu: (measured("cores_used") * 1000) / (p.cpu_milli || 1),
    mem: measured("memory_peak_bytes") / (p.memory_bytes || 1),
  });
  while (machineHistory.length > HISTORY) machineHistory.shift();
  const chart = $("#machine-chart");
  chart.replaceChildren();
  const t0 = machineHistory[0].at, span = (snap.at_ms - t0) || 1;
  for (const [key, colour, dash] of [["reserved", "#4fb3ff", "6 4"], ["cpu", "#4fb3ff", ""], ["mem", "#a78bfa", ""]]) {
    const pts = machineHistory.map((s) => `${(600 * (s.at - t0)) / span},${135 - Math.min(1, s[key]) * 125}`);
    if (pts.length === 1) pts.push(`600,${pts[0].split(",")[1]}`);
    chart.append(svg("polyline", { points: pts.join(" "), fill: "none", stroke: colour, "stroke-width": 2, "stroke-dasharray": dash }));
  }
}

// Each quota cell is "used of limit"; a limit left out of config.toml is no limit.
function renderQuotas(groups) {
  const of = (q, key, fmt) => h("td", { "data-quota": key },
    `${fmt(q.used[key])} of ${q.limits[key] === null ? "no limit" : fmt(q.limits[key])}`);
  fill($("#quotas tbody"), groups.map((q) => h("tr", { "data-group": q.name },
    h("td", {}, q.name),
    h("td", {}, q.peers.length ? `${q.peers.length} peer${q.peers.length > 1 ? "s" : ""}` : "everyone else"),
    h("td", { class: "num" }, q.priority),
    of(q, "jobs", String), of(q, "cpu_milli", cores), of(q, "memory_bytes", bytes), of(q, "gpus", String),
    of(q, "credits_per_day", credits))), "no quotas: every buyer is served alike", 8);
}

// -- the live stream -------------------------------------------------------------------------
function live(on, text) {
  $("#live-dot").className = `dot ${on ? "on" : "off"}`;
  $("#live-status").textContent = text;
}

function connect() {
  const stream = new EventSource("/v1/stream");
  let leaving = false; // the node ends each stream after a while; the browser reconnects
  stream.addEventListener("bye", () => { leaving = true; });
  stream.onopen = () => { leaving = false; };
  stream.onmessage = (event) => {
    snap = JSON.parse(event.data);
    live(true, `live · updated ${clock(snap.at_ms)}`);
    render();
  };
  stream.onerror = async () => {
    if (leaving) return;
    live(false, "reconnecting…");
    // The browser retries by itself; a 401 (session over, node restarted) goes to the login.
    try {
      const answer = await fetch("/v1/node", { credentials: "same-origin" });
      if (answer.status === 401) { stream.close(); location.href = "/dashboard/login"; }
    } catch (_) { live(false, "node unreachable, retrying"); }
  };
}

connect();
