// The console's state: the connection, the chosen book, the account's
// tables. One object, shared by the modules that read and change it.

export const state = {
  ws: null, nextId: 1, pending: new Map(), nonce: null,
  instruments: [], selected: null,
  book: { seq: 0, synced: false, bids: new Map(), asks: new Map() },
  trades: [], account: null, secret: null, refreshTimer: null,
  // The account's latest private events, for an order's outcome.
  events: [],
  leases: [], jobs: new Map(), services: new Map(), volumes: new Map(), logsJob: null, deliveries: new Map(), scores: new Map(), offersTimer: null,
  // The exchange's currency, from its listing (docs/protocol.md "listing").
  currency: { code: "USD", decimals: 6 }, regions: [],
  // The price chart: its interval, its uPlot, and a pending redraw.
  interval: "1m", chart: null, candlesTimer: null,
};
