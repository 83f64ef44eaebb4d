// The account once logged in: login, private events, orders, leases,
// jobs, notices, statement, sub-accounts, and the lookups of any
// supplier's score and any renter's record.

import { state } from "./state.js";
import { $, esc, fromHex, hex, money, parseAmount, symbolOf, utcHour } from "./util.js";
import { request } from "./connection.js";
import { act } from "./ticket.js";
import { showTelemetry } from "./documents.js";

// --- the account --------------------------------------------------------

export async function login(secretHex) {
  const secret = secretHex.trim();
  if (!/^[0-9a-fA-F]{64}$/.test(secret)) {
    throw new Error(`a key is 64 hex digits (the 32-byte secret in ~/.gpux/key); this has ${secret.length} character(s)${/^[0-9a-fA-F]*$/.test(secret) ? "" : ", not all hex digits"}`);
  }
  // Just after a log out (or a drop) the page reconnects: the login waits
  // for the new connection's challenge rather than being lost.
  await untilConnected();
  const pkcs8 = new Uint8Array([...fromHex("302e020100300506032b657004220420"), ...fromHex(secretHex.trim())]);
  const key = await crypto.subtle.importKey("pkcs8", pkcs8, { name: "Ed25519" }, true, ["sign"]);
  const jwk = await crypto.subtle.exportKey("jwk", key);
  const publicKey = Uint8Array.from(atob(jwk.x.replace(/-/g, "+").replace(/_/g, "/")), (c) => c.charCodeAt(0));
  const payload = new Uint8Array([...new TextEncoder().encode("gpux-auth-v1:"), ...fromHex(state.nonce)]);
  const signature = new Uint8Array(await crypto.subtle.sign({ name: "Ed25519" }, key, payload));
  const role = $("role").value || null;
  let body;
  try {
    ({ body } = await request("auth", { public_key: hex(publicKey), signature: hex(signature), role, market_data_version: 2 }));
  } catch (error) {
    throw new Error(whyRefused(error.message, role));
  }
  $("role").value = "";
  state.secret = secretHex;
  state.account = body.account;
  $("account").textContent = `account ${body.account} (${body.role})`;
  $("login").hidden = true;
  $("logout").hidden = false;
  showAccount(true);
  refreshAccount();
}

// A refused login in words: a key with no account yet is told to open one
// (the role chosen under Account, as `gpux login --role` does).
function whyRefused(message, role) {
  const code = message.split(":")[0];
  if (code === "auth_failed" && role === null) {
    return `${message}: this key has no account on this exchange (or it was revoked or has expired); to open one, choose a role under Account (renter, supplier or aggregator) and log in again`;
  }
  if (code === "invite_required" || code === "invite_invalid") {
    return `${message}: this exchange opens accounts by invitation: send its operator your public key (gpux keys show); \`gpux login --role ROLE --invite INVITATION\` then opens it`;
  }
  return message;
}

// Resolves once the page holds a live connection's challenge (10 s at most).
async function untilConnected() {
  const deadline = Date.now() + 10000;
  while (state.nonce === null || state.ws.readyState !== WebSocket.OPEN) {
    if (Date.now() > deadline) throw new Error("not connected to the exchange; is it running?");
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

// Logged in: the ticket and the account's tables; logged out: what to do.
function showAccount(shown) {
  $("mine").hidden = !shown;
  $("ticket-card").hidden = !shown;
  $("login-card").hidden = shown;
}

export function onPrivate(event, reason) {
  state.events.push(event);
  if (state.events.length > 500) state.events.splice(0, state.events.length - 500);
  const [kind, fields] = typeof event.kind === "string" ? [event.kind, {}] : Object.entries(event.kind)[0];
  if (kind === "rejected") notice(`Refused (${fields.code}): ${reason ?? ""}`);
  if (kind === "preemption_notice") notice(`Lease ${fields.lease} is preempted: it ends at ${utcHour(fields.ends_at_ms)}`);
  if (kind === "payment_notice") notice(`Lease ${fields.lease} needs ${money(fields.shortfall_minor)} more by ${utcHour(fields.ends_at_ms)}`);
  if (kind === "spend_alert") notice(`Spent ${money(fields.spent_minor)}: ${fields.threshold_bps / 100}% of your ${fields.daily ? "daily" : "total"} limit of ${money(fields.limit_minor)}`);
  clearTimeout(state.refreshTimer);
  state.refreshTimer = setTimeout(refreshAccount, 300);
}

// One line for a delivery STATE (docs/protocol.md "Delivery status").
function describeDelivery(deliveryState) {
  if (deliveryState === undefined || deliveryState === null) return "—";
  if (typeof deliveryState === "string") return deliveryState.replace("_", " ");
  const [name, f] = Object.entries(deliveryState)[0];
  if (name === "pulling") return `pulling ${f.bytes_done >> 20}/${f.bytes_total >> 20} MiB`;
  if (name === "running") {
    const ports = f.endpoints.map((e) => `${e.host}:${e.port}→${e.container_port}`).join(" ");
    return ["running", ports, f.ssh ?? ""].filter(Boolean).join(" ");
  }
  if (name === "exited") return `exited with code ${f.code}`;
  if (name === "failed") return `failed ${f.code} (${f.fault}'s side): ${f.reason}`;
  return name;
}

// A supplier's score as people read it: "99.14%", or "unrated" under 10 GPU-hours.
function describeScore(supplier) {
  if (!state.scores.has(supplier)) return `supplier ${supplier}`;
  const bps = state.scores.get(supplier);
  return `supplier ${supplier} · ${bps === null ? "unrated" : (bps / 100).toFixed(2) + "%"}`;
}

export function renderLeases() {
  $("leases").tBodies[0].innerHTML = state.leases
    .map((l) => {
      const ends = l.active ? (l.end_ms === null ? "open-ended" : utcHour(l.end_ms)) : `ended ${utcHour(l.ended_at_ms ?? l.end_ms)}`;
      const actions = `<button data-telemetry="${l.lease}">telemetry</button>${l.active ? ` <button data-end-lease="${l.lease}">end</button>` : ""}`;
      return `<tr><td class="text">${actions}</td><td>${l.lease}</td><td class="text">${l.kind}</td><td>${l.gpus.length}</td><td>${money(l.price_minor_per_gpu_hour)}</td><td class="text">${l.active ? "active" : "ended"}</td><td class="text">${ends}</td><td>${Math.floor(l.verified_gpu_ms / 1000)}</td><td>${money(l.usage_charged_minor)}</td><td class="supplier text">${describeScore(l.supplier)}</td><td class="delivery wrap">${esc(describeDelivery(state.deliveries.get(l.lease)))}</td></tr>`;
    })
    .join("");
}

// A job's state in words: "running (attempt 2)", "failed: retries_exhausted".
function describeJob(stateValue) {
  if (typeof stateValue === "string") return stateValue;
  const [name, detail] = Object.entries(stateValue)[0];
  if (name === "failed") return "failed: " + (typeof detail === "string" ? detail : Object.entries(detail).map(([k, v]) => `${k} ${v}`).join(""));
  return name;
}

export function renderJobs() {
  const jobs = [...state.jobs.values()].sort((a, b) => b.job - a.job);
  $("jobs").tBodies[0].innerHTML = jobs
    .map((j) => {
      const live = !["succeeded", "cancelled"].includes(describeJob(j.state)) && !describeJob(j.state).startsWith("failed");
      const actions = `<button data-job-bill="${j.job}">bill</button>${live ? ` <button data-job-logs="${j.job}">logs</button> <button data-cancel-job="${j.job}">cancel</button>` : ""}`;
      return `<tr data-job="${j.job}"><td class="text">${actions}</td><td>${j.job}</td><td class="text">${esc(j.name)}</td><td class="job-state text">${esc(describeJob(j.state))}</td><td>${j.attempts} of ${j.retries + 1}</td><td>${j.leases.join(", ")}</td><td>${money(j.escrowed_minor)} / ${money(j.budget_minor)}</td></tr>`;
    })
    .join("");
}

// A service's replicas in words: "2 ready, 1 starting, 1 bidding (bid refused: ...)".
function describeReplicas(service) {
  if (service.replicas.length === 0) return service.state === "running" ? "none (at zero)" : "none";
  const counts = new Map();
  for (const r of service.replicas) counts.set(r.state, (counts.get(r.state) || 0) + 1);
  const stalled = service.replicas.map((r) => r.stalled).filter((why) => why);
  const parts = ["ready", "starting", "bidding"].filter((name) => counts.has(name)).map((name) => `${counts.get(name)} ${name}`);
  const endpoints = service.replicas.map((r) => r.endpoint).filter((e) => e);
  const noticed = service.replicas.filter((r) => r.noticed).length;
  return (
    parts.join(", ") +
    (endpoints.length ? ` at ${endpoints.join(" ")}` : "") +
    (stalled.length ? ` (${stalled[0]})` : "") +
    (noticed ? ` · ${noticed} preempted, a stand-in replaces it` : "")
  );
}

export function renderServices() {
  const services = [...state.services.values()].sort((a, b) => b.service - a.service);
  $("services").tBodies[0].innerHTML = services
    .map((v) => {
      const spec = v.spec;
      const running = v.state === "running";
      const kept = v.replicas.length;
      const actions = `<button data-service-bill="${v.service}">bill</button>${running ? ` <button data-scale-service="${v.service}" data-replicas="${kept + 1}"${kept + 1 > spec.max_replicas ? " disabled" : ""}>+1</button> <button data-scale-service="${v.service}" data-replicas="${kept - 1}"${kept - 1 < spec.min_replicas ? " disabled" : ""}>−1</button> <button data-delete-service="${v.service}">delete</button>` : ""}`;
      const scaling = v.last_scaling ? `${v.last_scaling.from} → ${v.last_scaling.to} (${v.last_scaling.reason}) ${utcHour(v.last_scaling.at_ms)}` : spec.scaling ? "autoscaling, no change yet" : "manual";
      const rollout = v.rollout === "rolling" ? ` · rolling out run ${v.generation}` : v.rollout === "rolled_back" ? " · update rolled back" : "";
      const floor = v.floor ? ` · ${v.floor.replicas} on ${symbolOf(v.floor.instrument)}` : "";
      return `<tr data-service="${v.service}"><td class="text">${actions}</td><td>${v.service}</td><td class="text">${esc(spec.name)}</td><td class="service-state text">${esc(v.state)}${rollout}</td><td class="service-replicas text">${esc(describeReplicas(v))}</td><td class="text">${kept} (${spec.min_replicas}..${spec.max_replicas})${esc(floor)}</td><td>${v.replaced}</td><td class="text">${esc(scaling)}</td><td class="text wrap">${esc(spec.image)}</td></tr>`;
    })
    .join("");
}

// Who holds a volume: its writer's lease, a resting bid, readers.
function describeHolders(volume) {
  const parts = [];
  if (volume.writer !== null && volume.writer !== undefined) parts.push(`lease ${volume.writer} (writes)`);
  else if (volume.writer_bid !== null && volume.writer_bid !== undefined) parts.push(`a resting bid (${volume.writer_bid})`);
  if (volume.readers.length) parts.push(`lease ${volume.readers.join(", ")} (read-only)`);
  return parts.length ? parts.join(", ") : "free";
}

export function renderVolumes() {
  const volumes = [...state.volumes.values()].filter((v) => v.state !== "deleted").sort((a, b) => a.name.localeCompare(b.name));
  $("volumes").tBodies[0].innerHTML = volumes
    .map((v) => {
      const storage = v.unpaid_since_ms === null || v.unpaid_since_ms === undefined ? "paid" : `unpaid since ${utcHour(v.unpaid_since_ms)}: read-only from ${utcHour(v.read_only_from_ms)}, deleted from ${utcHour(v.delete_from_ms)}`;
      return `<tr data-volume="${esc(v.name)}"><td class="text"><button data-delete-volume="${esc(v.name)}">delete</button></td><td class="text">${esc(v.name)}</td><td>${v.size_gib}</td><td class="volume-holders text">${esc(describeHolders(v))}</td><td class="text">${esc(storage)}</td><td>${money(v.charged_minor)}</td><td class="text">${utcHour(v.created_at_ms)}</td></tr>`;
    })
    .join("");
}

// The running attempt's leases of a job (starting or running), by rank.
function attemptLeases(job) {
  if (!job || typeof job.state !== "object") return null;
  const [name, detail] = Object.entries(job.state)[0];
  return name === "running" || name === "starting" ? detail.leases : null;
}

// Follows one job's output while it runs (docs/jobs.md "Logs"): every
// 2 s each member's tail, from the host that runs it; once the job is over
// its kept tails are in the job store (`gpux job logs`).
async function followJobLogs(jobId) {
  state.logsJob = jobId;
  while (state.logsJob === jobId) {
    const job = state.jobs.get(jobId);
    const leases = attemptLeases(job);
    if (leases === null) {
      const over = job ? describeJob(job.state) : "unknown";
      $("job-logs").textContent += `\n-- job ${jobId} is ${over}: \`gpux job logs ${jobId}\` reads the tails its hosts kept in the job store`;
      state.logsJob = null;
      return;
    }
    const parts = [];
    for (const [rank, lease] of leases.entries()) {
      try {
        const { body } = await request("lease_logs", { lease, tail_bytes: 16384 });
        parts.push(`== rank ${rank} (lease ${lease})${body.truncated ? " (tail)" : ""}\n${body.data}`);
      } catch (error) {
        parts.push(`== rank ${rank} (lease ${lease}): ${error.message}`);
      }
    }
    if (state.logsJob !== jobId) return;
    $("job-logs").textContent = `job ${jobId}, attempt ${Object.values(job.state)[0].attempt}\n` + parts.join("\n");
    await new Promise((resolve) => setTimeout(resolve, 2000));
  }
}

function notice(text) {
  const item = document.createElement("li");
  item.textContent = text;
  $("notices").prepend(item);
}

export async function refreshAccount() {
  if (state.account === null) return;
  const { body: b } = await request("balance");
  let spendLine = "";
  try {
    const { body: spend } = await request("spend");
    if (spend.spend !== null) {
      const s = spend.spend;
      const limit = (value) => (value === null ? "no limit" : money(value));
      spendLine = ` · spend: today ${money(s.spent_today_minor)} (daily ${limit(s.limits.daily_minor)}), in all ${money(s.spent_total_minor)} (total ${limit(s.limits.total_minor)}), held limit ${limit(s.limits.max_held_minor)}`;
    }
  } catch (error) {
    spendLine = "";
  }
  $("balance").textContent = `available ${money(b.available_minor)} · held ${money(b.held_minor)} · payable ${money(b.payable_minor)} · owed ${money(b.debt_minor)}` + spendLine;
  const { body: orders } = await request("open_orders", {});
  $("orders").tBodies[0].innerHTML = orders.orders
    .map((o) => `<tr><td class="text"><button data-cancel-order="${o.order}">cancel</button>${o.resting ? ` <button data-replace-order="${o.order}" title="to the ticket's price and quantity">replace</button>` : ""}</td><td>${o.order}</td><td class="text">${esc(symbolOf(o.instrument))}</td><td class="${o.side}">${o.side}</td><td>${money(o.price_minor_per_gpu_hour)}</td><td>${o.quantity}</td><td class="text">${o.resting ? "on the book" : "armed stop"}</td></tr>`)
    .join("");
  const { body: leases } = await request("leases", {});
  state.leases = leases.leases;
  // The last status of each active lease not yet seen on the feed (pushes
  // keep them current afterwards).
  for (const l of state.leases.filter((l) => l.active && !state.deliveries.has(l.lease)).slice(0, 20)) {
    const { body: known } = await request("lease_delivery", { lease: l.lease });
    if (known.state !== null && !state.deliveries.has(l.lease)) state.deliveries.set(l.lease, known.state);
  }
  // Each supplier's reliability score (public; docs/market-rules.md "Reliability score").
  for (const supplier of [...new Set(state.leases.map((l) => l.supplier))].slice(0, 20)) {
    const { body: stats } = await request("supplier_stats", { supplier });
    state.scores.set(supplier, stats.record.score_bps);
  }
  renderLeases();
  const { body: jobs } = await request("jobs", { offset: 0 });
  for (const job of jobs.jobs) state.jobs.set(job.job, job);
  renderJobs();
  try {
    const { body: services } = await request("services", { offset: 0 });
    for (const service of services.services) state.services.set(service.service, service);
    renderServices();
    const { body: volumes } = await request("volumes");
    state.volumes = new Map(volumes.volumes.map((v) => [v.volume, v]));
    renderVolumes();
  } catch (error) {
    $("service-result").textContent = "refused: " + error.message;
  }
  try {
    const { body: subs } = await request("sub_accounts", { offset: 0 });
    const limit = (value, show) => (value === null ? "none" : show(value));
    $("subs").tBodies[0].innerHTML = subs.sub_accounts
      .map((sub) => {
        const l = sub.limits;
        const limits = `orders ${limit(l.max_open_orders, String)} · one bid ${limit(l.max_order_minor, money)} · held ${limit(l.max_held_minor, money)}`;
        return `<tr><td>${sub.account}</td><td>${money(sub.balances.available_minor)}</td><td>${money(sub.balances.held_minor)}</td><td>${money(sub.balances.debt_minor)}</td><td>${sub.open_orders}</td><td class="text">${limits}</td></tr>`;
      })
      .join("");
  } catch (error) {
    // A key without the read scope sees none (the rest shows what it may).
    $("subs").tBodies[0].innerHTML = `<tr><td colspan="6">${esc(error.message)}</td></tr>`;
  }
  await showStatement(null);
}

// The statement newest first, a page at a time ("older" pages back).
async function showStatement(before) {
  const { body: statement } = await request("recent_statement", { before });
  state.statementBefore = statement.next_before;
  $("statement-older").hidden = statement.next_before === null;
  $("statement").tBodies[0].innerHTML = statement.lines
    .map((s) => `<tr><td>${s.transfer}</td><td>${utcHour(s.at_ms)}</td><td class="text">${s.from}</td><td class="text">${s.to}</td><td>${money(s.amount_minor)}</td><td>${s.lease ?? ""}</td><td class="wrap">${esc(s.description)}</td></tr>`)
    .join("");
}

$("statement-older").onclick = () => showStatement(state.statementBefore);
$("statement-newest").onclick = () => showStatement(null);

// Any supplier's reliability (public, no login needed): its score and record,
// then each host's.
async function lookUpSupplier(supplier) {
  const out = $("supplier-stats");
  try {
    const { body } = await request("supplier_stats", { supplier });
    state.scores.set(supplier, body.record.score_bps);
    const line = (r) => {
      const score = r.score_bps === null ? "unrated" : (r.score_bps / 100).toFixed(2) + "%";
      const hours = (ms) => (ms / 3.6e6).toFixed(1);
      const challenges = `hardware challenges ${r.challenges_passed} passed, ${r.challenges_too_slow} too slow, ${r.challenges_failed} wrong, ${r.challenges_unanswered} unanswered`;
      const conduct = `${r.disputes} disputes proven by renters' GPU probes (${hours(r.disputed_gpu_ms)} GPU-h), ${r.disconnects_during_leases} disconnects during leases, ${r.preemptions_late} preemptions honoured late`;
      return `${score}: ${hours(r.verified_gpu_ms)} of ${hours(r.leased_gpu_ms)} GPU-h verified, ${r.leases_closed} leases, ${r.failed_deliveries} failed deliveries (${r.failed_deliveries_in_row ?? 0} in a row now), ${challenges}, ${conduct}`;
    };
    const hosts = body.hosts.map((h) => `<li>${esc(h.host_name)}: ${line(h.record)}</li>`).join("");
    out.innerHTML = `<p>supplier ${body.supplier}, last ${body.window_days} days: ${line(body.record)}</p><ul>${hosts}</ul>`;
  } catch (error) {
    out.textContent = error.message;
  }
}

// Any account's record as a renter (public): the liveness observations it
// signed and the disputes they raised (docs/market-rules.md "Disputes").
async function lookUpRenter(renter) {
  const out = $("renter-stats");
  try {
    const { body } = await request("renter_stats", { renter });
    const r = body.record;
    const hours = (ms) => (ms / 3.6e6).toFixed(2);
    out.textContent = `renter ${body.renter}: ${r.observations} signed observations, ${hours(r.unreachable_ms)} h signed unreachable, ${r.disputes} disputes (${hours(r.disputed_gpu_ms)} GPU-h of reported time)`;
  } catch (error) {
    out.textContent = error.message;
  }
}

$("renter-lookup").onsubmit = (event) => {
  event.preventDefault();
  lookUpRenter(Number($("renter-id").value));
};

$("supplier-lookup").onsubmit = (event) => {
  event.preventDefault();
  lookUpSupplier(Number($("supplier-id").value));
};

$("orders").onclick = (event) => {
  const order = event.target.dataset && event.target.dataset.cancelOrder;
  if (order) act("cancel_order", { order: Number(order) }, `order ${order} cancelled`);
  // Cancel-replace to the ticket's price and quantity (time priority kept
  // only when the price is unchanged and the quantity does not grow).
  const replace = event.target.dataset && event.target.dataset.replaceOrder;
  if (replace) {
    try {
      const price_minor_per_gpu_hour = parseAmount($("t-price").value);
      const quantity = Number($("t-quantity").value);
      act("replace_order", { order: Number(replace), price_minor_per_gpu_hour, quantity }, `order ${replace} replaced at ${money(price_minor_per_gpu_hour)} x ${quantity}`);
    } catch (error) {
      $("ticket-result").textContent = "refused: " + error.message;
    }
  }
};

$("jobs").onclick = async (event) => {
  const cancel = event.target.dataset && event.target.dataset.cancelJob;
  if (cancel) {
    try {
      const { body } = await request("cancel_job", { job: Number(cancel) });
      state.jobs.set(body.job.job, body.job);
      renderJobs();
    } catch (error) {
      $("job-bill").textContent = "refused: " + error.message;
    }
  }
  const logs = event.target.dataset && event.target.dataset.jobLogs;
  if (logs) followJobLogs(Number(logs));
  const billed = event.target.dataset && event.target.dataset.jobBill;
  if (billed) {
    try {
      const { body } = await request("job_bill", { job: Number(billed), offset: 0 });
      const t = body.invoice.totals;
      $("job-bill").textContent = `${body.invoice.number}: ${body.line_count} line(s), charges ${money(t.charges_minor)}, credits ${money(t.credits_minor)}, due ${money(t.amount_due_minor)} (signed by the exchange: gpux job bill ${billed} checks it)`;
    } catch (error) {
      $("job-bill").textContent = "refused: " + error.message;
    }
  }
};

$("services").onclick = async (event) => {
  const data = event.target.dataset || {};
  try {
    if (data.serviceBill) {
      const { body } = await request("service_bill", { service: Number(data.serviceBill), offset: 0 });
      const t = body.invoice.totals;
      $("service-result").textContent = `${body.invoice.number}: ${body.line_count} line(s), charges ${money(t.charges_minor)}, credits ${money(t.credits_minor)}, due ${money(t.amount_due_minor)} (signed by the exchange: gpux service bill ${data.serviceBill} checks it)`;
    } else if (data.scaleService) {
      const { body } = await request("scale_service", { service: Number(data.scaleService), replicas: Number(data.replicas) });
      state.services.set(body.service.service, body.service);
      renderServices();
      $("service-result").textContent = `service ${body.service.service} keeps ${data.replicas} replica(s)`;
    } else if (data.deleteService) {
      const { body } = await request("delete_service", { service: Number(data.deleteService) });
      state.services.set(body.service.service, body.service);
      renderServices();
      $("service-result").textContent = `service ${body.service.service} deleted: its bids cancelled, its leases ended`;
    }
  } catch (error) {
    $("service-result").textContent = "refused: " + error.message;
  }
};

$("volumes").onclick = async (event) => {
  const name = event.target.dataset && event.target.dataset.deleteVolume;
  if (!name) return;
  try {
    const { body } = await request("delete_volume", { name });
    state.volumes.set(body.volume.volume, body.volume);
    renderVolumes();
    $("volume-result").textContent = `volume ${name} deleted: its files are removed from the store`;
  } catch (error) {
    $("volume-result").textContent = "refused: " + error.message;
  }
};

$("volume-create").onsubmit = async (event) => {
  event.preventDefault();
  try {
    const { body } = await request("create_volume", { name: $("volume-name").value.trim(), size_gib: Number($("volume-size").value) });
    state.volumes.set(body.volume.volume, body.volume);
    renderVolumes();
    $("volume-result").textContent = `volume ${body.volume.name} (${body.volume.size_gib} GiB) created`;
  } catch (error) {
    $("volume-result").textContent = "refused: " + error.message;
  }
};

$("leases").onclick = (event) => {
  const lease = event.target.dataset && event.target.dataset.endLease;
  if (lease) act("end_lease", { lease: Number(lease) }, `lease ${lease} ended`);
  const watched = event.target.dataset && event.target.dataset.telemetry;
  if (watched) showTelemetry(Number(watched)).catch((error) => ($("telemetry-lease").textContent = "refused: " + error.message));
};

$("sub-open").onsubmit = async (event) => {
  event.preventDefault();
  try {
    const { body } = await request("open_sub_account");
    $("sub-result").textContent = `opened sub-account ${body.account} (journal entry ${body.journal_seq})`;
    $("sub-id").value = body.account;
    refreshAccount();
  } catch (error) {
    $("sub-result").textContent = "refused: " + error.message;
  }
};

$("sub-move").onsubmit = async (event) => {
  event.preventDefault();
  try {
    const sub_account = Number($("sub-id").value);
    const amount_minor = parseAmount($("sub-amount").value);
    const to_sub_account = $("sub-direction").value === "in";
    const { body } = await request("move_funds", { sub_account, amount_minor, to_sub_account });
    $("sub-result").textContent = `moved ${money(amount_minor)} ${to_sub_account ? "to" : "back from"} sub-account ${sub_account} (journal entry ${body.journal_seq})`;
    refreshAccount();
  } catch (error) {
    $("sub-result").textContent = "refused: " + error.message;
  }
};

// Logging out forgets the key and ends the session: the page reconnects
// to market data only.
$("logout").onclick = () => {
  state.secret = null;
  state.account = null;
  $("account").textContent = "";
  showAccount(false);
  $("login").hidden = false;
  $("logout").hidden = true;
  $("secret").value = "";
  // The old connection's challenge is spent: a login waits for the next one.
  state.nonce = null;
  state.ws.close();
};

$("login").onsubmit = (event) => {
  event.preventDefault();
  login($("secret").value).catch((error) => ($("account").textContent = "login failed: " + error.message));
};
