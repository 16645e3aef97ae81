// The node's dashboard: polls its own API every two seconds and redraws. No framework, no
// CDN: uPlot is copied from the npm lock into the API's static assets at install time.
"use strict";

const PERIOD_MS = 2000;
const charts = {};

async function get(path) {
  const answer = await fetch(path, { cache: "no-store" });
  if (!answer.ok) throw new Error(`${path}: ${answer.status}`);
  return answer.json();
}

function text(id, value) {
  document.getElementById(id).textContent = value === null || value === undefined ? "–" : value;
}

function short(id) {
  return id && id.length > 14 ? `${id.slice(0, 8)}…${id.slice(-4)}` : id || "–";
}

function rows(tableId, items, cells, rowClass = () => "") {
  const body = document.querySelector(`#${tableId} tbody`);
  body.replaceChildren(
    ...items.map((item) => {
      const row = document.createElement("tr");
      row.className = rowClass(item);
      for (const cell of cells(item)) {
        const td = document.createElement("td");
        td.textContent = cell === null || cell === undefined ? "–" : cell;
        row.appendChild(td);
      }
      return row;
    }),
  );
}

const COLOURS = ["#2563eb", "#d97706"];

// One line per label; `columns` holds one array of values per label, over the times `xs`.
function chart(id, labels, xs, columns) {
  const target = document.getElementById(id);
  const data = [xs, ...columns];
  if (!charts[id]) {
    const lines = labels.map((label, i) => ({ label, stroke: COLOURS[i], width: 2, spanGaps: true }));
    charts[id] = new uPlot(
      {
        width: Math.max(300, target.clientWidth || 480),
        height: 200,
        series: [{}, ...lines],
        axes: [{}, {}],
      },
      data,
      target,
    );
  } else {
    charts[id].setData(data);
  }
}

// "in 47 min": how far off a time is, in the largest unit that keeps it readable.
function after(seconds) {
  if (seconds <= 0) return "now";
  if (seconds < 90) return `in ${Math.round(seconds)} s`;
  const minutes = Math.round(seconds / 60);
  if (minutes < 90) return `in ${minutes} min`;
  return `in ${Math.floor(minutes / 60)} h ${minutes % 60} min`;
}

function bytes(n) {
  const units = ["B", "kB", "MB", "GB", "TB"];
  let i = 0;
  while (n >= 1000 && i < units.length - 1) { n /= 1000; i += 1; }
  return `${i === 0 ? n : n.toFixed(1)} ${units[i]}`;
}

function renderStatus(status) {
  // The name alone: "GWTF node <name>" read "GWTF node node" for a node named "node".
  text("name", status.name);
  document.title = `${status.name} · GWTF`;
  const health = document.getElementById("health");
  health.textContent = status.health.status;
  health.className = `badge ${status.health.status}`;
  health.title = status.health.detail;
  text("role", status.role);
  text("stage", `${status.stage} of ${status.stages}`);
  text("iteration", status.iteration);
  text("epoch", status.epoch);
  text("throughput", status.throughput_hops_per_s.toFixed(2));
  text("loss", status.role === "relay" ? "on data nodes"
    : status.loss === null ? null : status.loss.toFixed(4));
  // Verified when two relays of each stage agreed on the held-out loss; else one relay's word.
  const validation = document.getElementById("validation-loss");
  text("validation-loss", status.role === "relay" ? "on data nodes"
    : status.validation_loss === null ? null
      : `${status.validation_loss.toFixed(4)}${status.validation_verified ? "" : " *"}`);
  validation.title = status.validation_loss === null ? ""
    : `after iteration ${status.validation_iteration}; `
      + (status.validation_verified ? "two relays of each stage agreed"
        : "* a stage's came from one relay, whose word it rests on");
  text("updated", `updated ${new Date(status.updated_at * 1000).toLocaleTimeString()}`);
  // Counted from the snapshot's time: the chain's clock, which a devnet may have moved on.
  const claim = document.getElementById("next-claim");
  const left = status.next_claim_in_s;
  text("next-claim", left === null ? null
    : after(left - (Date.now() / 1000 - status.updated_at)));
  claim.title = left === null ? "" : `chain time ${status.next_claim_at}`;
  const disk = status.disk;
  text("disk", disk === null ? null : bytes(disk.total_bytes));
  document.getElementById("disk").title = disk === null ? "" : [
    `database ${disk.database_bytes === null ? "on a server" : bytes(disk.database_bytes)}`,
    `evidence ${disk.evidence_bytes === null ? "none kept" : bytes(disk.evidence_bytes)}`,
  ].join(", ");
}

function renderPipeline(status, peers) {
  const column = (title, list, self) => {
    const div = document.createElement("div");
    if (self) div.className = "self";
    const h = document.createElement("h3");
    h.textContent = title;
    div.appendChild(h);
    for (const peer of list) {
      const p = document.createElement("div");
      p.className = "peer";
      p.textContent = `${short(peer.peer_id)} stage ${peer.stage} ${peer.region}${peer.alive ? "" : " (silent)"}`;
      div.appendChild(p);
    }
    return div;
  };
  const by = (place) => peers.filter((peer) => peer.place === place);
  const self = { peer_id: status.peer_id, stage: status.stage, region: status.region, alive: true };
  document.getElementById("pipeline").replaceChildren(
    column("upstream", by("upstream")),
    column("this node and its stage", [self, ...by("same stage")], true),
    column("downstream", by("downstream")),
  );
}

// "2026-12-06 17:05 UTC": a chain time as the node's commands write it.
function utc(unixS) {
  return `${new Date(unixS * 1000).toISOString().slice(0, 16).replace("T", " ")} UTC`;
}

function renderEarnings(earnings) {
  text("claimed-eth", earnings.total_claimed.eth);
  text("claimable-eth", earnings.total_claimable.eth);
  text("pending-eth", earnings.total_pending.eth);
  // A tensor dispute about an epoch's work freezes the stake, and the epoch's claim until the
  // court rules or, ruled without a jury, until its grace ends (then only the stake waits for
  // a release).
  const holds = earnings.stake_holds;
  const frozen = new Map(holds
    .filter((h) => h.run_id === earnings.run_id && !h.releasable)
    .map((h) => [h.epoch, h.until === null ? "the court rules" : utc(h.until)]));
  rows("earnings", earnings.epochs, (e) => [
    e.epoch, e.phase, e.units_worked, e.units_certified, e.units_challenged, e.units_missed,
    e.pending.eth,
    frozen.has(e.epoch) ? `${e.claimable.eth} frozen until ${frozen.get(e.epoch)}` : e.claimable.eth,
    e.claimed.eth, e.chain_claimed ? e.chain_claimed.eth : null,
    e.missed === null ? "" : e.missed.replace(/0x[0-9a-fA-F]{40}/g, short),
  ], (e) => [e.units_missed > 0 ? "missed" : "", frozen.has(e.epoch) ? "frozen" : ""].join(" ").trim());
  document.getElementById("holds").hidden = holds.length === 0;
  const list = document.querySelector("#holds ul");
  list.replaceChildren(...holds.map((hold) => {
    const item = document.createElement("li");
    item.textContent = hold.detail;
    return item;
  }));
}

async function refresh() {
  try {
    const [status, peers, history] = await Promise.all([
      get("/v1/status"), get("/v1/peers"), get("/v1/history"),
    ]);
    renderStatus(status);
    renderPipeline(status, peers);
    const xs = history.points.map((p) => p.t);
    chart("throughput-chart", ["hops / s"], xs, [history.points.map((p) => p.throughput_hops_per_s)]);
    // Relays never see the loss (the data node computes it): say so instead of an empty chart.
    const relay = status.role === "relay";
    document.getElementById("loss-note").hidden = !relay;
    document.getElementById("loss-chart").hidden = relay;
    if (!relay) {
      chart("loss-chart", ["loss", "validation loss"], xs, [
        history.points.map((p) => p.loss), history.points.map((p) => p.validation_loss),
      ]);
    }
  } catch (error) {
    const health = document.getElementById("health");
    health.textContent = "unreachable";
    health.className = "badge unreachable";
    health.title = String(error);
  }
  // Earnings, receipts and slashes need the node's receipts and a chain reading: shown when
  // there (503 until then).
  get("/v1/earnings").then(renderEarnings).catch(() => {});
  get("/v1/receipts?limit=10").then((page) => rows("receipts", page.items, (r) => [
    r.epoch, r.iteration, r.microbatch_id, r.stage, r.direction,
    r.as_worker ? "worker" : "receiver", short(r.as_worker ? r.counterparty : r.worker), r.units,
    r.counterparty_signature ? "yes" : "no",
  ])).catch(() => {});
  get("/v1/slashes").then((list) => rows("slashes", list, (s) => [
    short(s.node), s.epoch, s.fraud, s.slashed.eth,
  ])).catch(() => {});
}

refresh();
setInterval(refresh, PERIOD_MS);
