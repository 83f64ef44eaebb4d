// The WebSocket connection: requests with ids and their answers, and
// where each pushed message goes (docs/protocol.md).

import { state } from "./state.js";
import { $ } from "./util.js";
import { loadInstruments, onFeed } from "./market.js";
import { login, onPrivate, renderJobs, renderLeases, renderServices, renderVolumes } from "./account.js";

export function request(type, fields = {}) {
  const id = ++state.nextId;
  state.ws.send(JSON.stringify({ [type]: { id, ...fields } }));
  return new Promise((resolve, reject) => {
    state.pending.set(id, { resolve, reject });
  });
}

export function connect() {
  state.ws = new WebSocket(window.GPUX_WS);
  state.ws.onopen = () => ($("connection").textContent = "connected to " + window.GPUX_WS);
  state.ws.onclose = () => {
    $("connection").textContent = "disconnected; reconnecting…";
    // Requests in flight get no answer on this socket.
    for (const waiting of state.pending.values()) waiting.reject(new Error("disconnected"));
    state.pending.clear();
    state.book.synced = false;
    setTimeout(connect, 1000);
  };
  state.ws.onmessage = (frame) => {
    const message = JSON.parse(frame.data);
    const [type, body] = Object.entries(message)[0];
    if (type === "challenge") {
      state.nonce = body.nonce;
      // Market-data version 2 before any login too: feed messages batched,
      // a book the page fell behind on conflated (docs/protocol.md).
      request("market_data_version", { version: 2 }).catch(() => {});
      loadInstruments();
      // After a reconnect, log in again with the key already in the page.
      if (state.secret !== null) {
        login(state.secret).catch((error) => ($("account").textContent = "login failed: " + error.message));
      }
      return;
    }
    const waiting = body && body.id !== undefined && state.pending.get(body.id);
    if (waiting) {
      state.pending.delete(body.id);
      if (type === "reject" || type === "error") waiting.reject(new Error(body.code + ": " + body.message));
      else waiting.resolve({ type, body });
      return;
    }
    if (type === "market_data") {
      // Market-data version 2: several feed messages, in order.
      for (const inner of body.messages) onFeed(...Object.entries(inner)[0]);
    } else if (onFeed(type, body)) return;
    else if (type === "private") onPrivate(body.event, body.reason);
    else if (type === "delivery") {
      state.deliveries.set(body.lease, body.state);
      renderLeases();
    } else if (type === "job_update") {
      state.jobs.set(body.job.job, body.job);
      renderJobs();
    } else if (type === "service_update") {
      state.services.set(body.service.service, body.service);
      renderServices();
    } else if (type === "volume_update") {
      state.volumes.set(body.volume.volume, body.volume);
      renderVolumes();
    }
  };
}
