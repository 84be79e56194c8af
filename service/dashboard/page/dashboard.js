// pagedserve live engine dashboard: reads the server-sent feed at /dashboard/events and draws the
// engine's steps, KV cache blocks, request lanes and waiting queue. No framework, no build step.
"use strict";

(() => {
  const KEY_STORE = "pagedserve.dashboard.key";
  const STEPS_KEPT = 600;       // ring buffer of step summaries
  const STEPS_SHOWN = 300;      // bars on the timeline
  const ENDED_KEPT = 100;       // finished/aborted lanes kept after the in-flight ones
  const LANE_WINDOW_S = 30;     // lanes' shared time axis
  const SEGMENTS_KEPT = 24;     // history segments per lane
  const STALE_RECORDS = 200;    // in-flight lane unseen this long (queue complete): ended unseen
  const STALL_MS = 45000;       // no byte for this long (pings come every 15 s): reconnect
  const MAX_BUFFER = 8 << 20;   // an unterminated SSE record this big means a broken stream
  const KV_MIN_HEIGHT = 200;    // px the block grid may always take before cells shrink
  const KV_CELLS = [16, 14, 12, 10, 9, 8, 7, 6, 5, 4, 3];

  // Colours are read from CSS custom properties so the page's style sheet owns the palette.
  const css = getComputedStyle(document.documentElement);
  const color = (name) => css.getPropertyValue("--" + name).trim();
  const C = {
    prefill: color("prefill"), decode: color("decode"), queued: color("queued"), preempt: color("preempt"),
    over: color("over"), line: color("ink"), faint: color("faint"), grid: color("grid"),
    kv: { ".": color("kv-free"), c: color("kv-cached"), u: color("kv-used"), s: color("kv-shared") },
    highlight: color("highlight"),
  };
  const KV_NAMES = { ".": "free", c: "cached (reusable prefix)", u: "used", s: "shared" };

  const $ = (id) => document.getElementById(id);
  const el = {
    status: $("status"), model: $("model"), backend: $("backend"), step: $("step"), running: $("running"),
    waiting: $("waiting"), preempted: $("preempted"), dropped: $("dropped"), itl: $("itl-target"),
    notice: $("notice"), noticeText: $("notice-text"), keyForm: $("key-form"), keyInput: $("key-input"),
    timeline: $("timeline"), kvmap: $("kvmap"), lanes: $("lanes"), queue: $("queue"),
    queueMore: $("queue-more"), queueEmpty: $("queue-empty"), tooltip: $("tooltip"),
    kvCount: { total: $("kv-total"), used: $("kv-used"), cached: $("kv-cached"), shared: $("kv-shared"),
      free: $("kv-free") },
  };

  // ---- state ----------------------------------------------------------------------------------
  const state = {
    step: 0, running: 0, waiting: 0, preempted: 0, itlTarget: null,   // null: not told yet
    droppedEarlier: 0, droppedNow: 0,    // dropped counts restart with each connection
    kv: { total: 0, used: 0, cached: 0, shared: 0, free: 0, map: "" },
    queue: [], queueMore: 0, queueKey: "", queueAt: 0,   // queueAt: when (our clock) it was sent
    clockOffset: 0,                      // server unix seconds minus ours
  };
  const steps = { buf: new Array(STEPS_KEPT), head: 0, size: 0, lastId: 0, breakNext: null };
  const lanes = new Map();               // request id -> lane, in-flight and ended
  const ended = [];                      // ended lanes, newest first (their DOM order too)
  let ownerIndex = null;                 // block id -> [request ids], built on demand
  const hover = { kv: null, lane: null, highlight: null };
  const sizes = { timeline: 0, kv: 0, kvHeight: 0 };
  const dirty = new Set();
  let frame = 0;

  const hook = window.pagedserveDashboard = {
    connected: false, records: 0, lastStep: 0,
    kv: { total: 0, used: 0, cached: 0, shared: 0, free: 0 },
    lanes: () => Array.from(lanes.values(), (l) => ({ id: l.id, state: l.state })),
    stepsKept: () => steps.size,         // the timeline's ring buffer (at most STEPS_KEPT)
    highlight: null,                     // request whose blocks are highlighted in the grid
    highlighted: () => {                 // those blocks' ids
      const lane = lanes.get(hook.highlight);
      return lane ? lane.blocks.filter((b) => b < (state.kv.map || "").length) : [];
    },
    errors: [],
  };

  function noteError(what) {
    hook.errors.push(String(what));
    if (hook.errors.length > 50) hook.errors.shift();
  }
  window.addEventListener("error", (e) => noteError(e.message));
  window.addEventListener("unhandledrejection", (e) => noteError(e.reason));

  const serverNow = () => Date.now() / 1000 + state.clockOffset;
  function syncClock(serverTime) {
    if (typeof serverTime === "number") state.clockOffset = serverTime - Date.now() / 1000;
  }

  // ---- the feed: fetch + our own SSE parser (EventSource cannot send Authorization) -----------
  const conn = { key: loadKey(), controller: null, backoff: 0.5, timer: 0, lastByte: 0 };

  // The key comes from #key=... (then kept in sessionStorage and taken out of the address bar).
  function loadKey() {
    const m = /(?:^#|&)key=([^&]*)/.exec(location.hash);
    if (m) {
      const key = decodeURIComponent(m[1]);
      try { sessionStorage.setItem(KEY_STORE, key); } catch { /* storage off: key lives in memory */ }
      history.replaceState(null, "", location.pathname + location.search);
      return key;
    }
    try { return sessionStorage.getItem(KEY_STORE) || ""; } catch { return ""; }
  }

  async function connect() {
    clearTimeout(conn.timer);
    if (conn.controller) conn.controller.abort();
    const controller = new AbortController();
    conn.controller = controller;
    const headers = conn.key ? { Authorization: "Bearer " + conn.key } : {};
    let response;
    try {
      response = await fetch("/dashboard/events", { headers, signal: controller.signal, cache: "no-store" });
    } catch {
      return reconnectLater(controller);
    }
    if (controller !== conn.controller) return;     // superseded while waiting (a new key)
    if (response.status === 401) {
      response.body?.cancel().catch(() => {});
      return askForKey(conn.key ? "That key was not accepted. Enter an API key of this server."
        : "This server needs an API key to show its engine.");
    }
    if (response.status === 404) {
      response.body?.cancel().catch(() => {});
      setStatus("off");
      return showNotice("Nothing to show: the dashboard is turned off on this server.", false);
    }
    if (!response.ok || !response.body) return reconnectLater(controller);
    try {
      await readStream(response.body.getReader(), controller);
    } catch (err) {
      // A broken connection (TypeError) or our own abort is what reconnecting is for, not a bug.
      if (!controller.signal.aborted && !(err instanceof TypeError)) noteError(err);
    }
    reconnectLater(controller);
  }

  // Server gone or stream ended: try again, 0.5 s doubling to 5 s, forever.
  function reconnectLater(controller) {
    if (controller !== conn.controller) return;     // a newer connection took over
    controller.abort();
    hook.connected = false;
    setStatus("reconnecting");
    conn.timer = setTimeout(connect, conn.backoff * 1000);
    conn.backoff = Math.min(5, conn.backoff * 2);
  }

  async function readStream(reader, controller) {
    const decoder = new TextDecoder();
    let buffer = "";
    conn.lastByte = Date.now();
    for (;;) {
      const { value, done } = await reader.read();
      if (done || controller.signal.aborted) return;
      conn.lastByte = Date.now();
      buffer += decoder.decode(value, { stream: true });
      buffer = takeRecords(buffer);
      if (buffer.length > MAX_BUFFER) throw new Error("SSE record too large");
    }
  }

  // Dispatches every complete record (ended by a blank line) and returns the unfinished rest.
  function takeRecords(buffer) {
    if (buffer.includes("\r")) {
      const tail = buffer.endsWith("\r") ? "\r" : "";     // a CRLF may be split across chunks
      buffer = buffer.slice(0, buffer.length - tail.length).replace(/\r\n?/g, "\n") + tail;
    }
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      dispatch(buffer.slice(0, end));
      buffer = buffer.slice(end + 2);
    }
    return buffer;
  }

  function dispatch(record) {
    let event = "message";
    const data = [];
    for (const line of record.split("\n")) {
      if (line === "" || line.startsWith(":")) continue;          // comments are keep-alives
      const colon = line.indexOf(":");
      const field = colon < 0 ? line : line.slice(0, colon);
      let value = colon < 0 ? "" : line.slice(colon + 1);
      if (value.startsWith(" ")) value = value.slice(1);
      if (field === "event") event = value;
      else if (field === "data") data.push(value);
    }
    if (!data.length) return;
    try {
      const handler = HANDLERS[event];
      if (handler) handler(normalize(JSON.parse(data.join("\n"))));
    } catch (err) {
      noteError(`${event}: ${err && err.message || err}`);
    }
  }

  // A silent stream (no data, no ping) is a dead one: abort it so the reader reconnects.
  setInterval(() => {
    if (hook.connected && Date.now() - conn.lastByte > STALL_MS) conn.controller?.abort();
  }, 5000);
  // Lanes' time axis moves on even while no record comes.
  setInterval(() => { if (hook.connected) invalidate("lanes", "queue"); }, 1000);

  // ---- status, notice and key form ------------------------------------------------------------
  function setStatus(text) {
    el.status.textContent = text;
    el.status.dataset.status = text;
  }

  function showNotice(text, withForm) {
    el.noticeText.textContent = text;
    el.keyForm.hidden = !withForm;
    el.notice.hidden = false;
  }

  function askForKey(text) {
    hook.connected = false;
    setStatus("needs key");
    showNotice(text, true);
    el.keyInput.focus();
  }

  el.keyForm.addEventListener("submit", (event) => {
    event.preventDefault();
    conn.key = el.keyInput.value.trim();
    try { sessionStorage.setItem(KEY_STORE, conn.key); } catch { /* memory only */ }
    el.keyInput.value = "";
    el.notice.hidden = true;
    conn.backoff = 0.5;
    setStatus("connecting");
    connect();
  });

  // ---- records ----------------------------------------------------------------------------------
  // A record's costly parts (the block map and its shared count, each running request's blocks, the
  // queue) come in its `detail`, at most every 100 ms; a null detail means "unchanged since the last
  // one", so a field left undefined here keeps what the page shows of it. Rows come as columns.
  function normalize(d) {
    const detail = d.detail || {};
    const out = { ...d, queue: detail.queue, queue_more: detail.queue_more, preempted: detail.preempted,
      tables: detail.tables };
    if (d.kv) {
      out.kv = { ...d.kv };
      if (detail.map !== undefined) out.kv.map = detail.map;
      if (detail.shared !== undefined) out.kv.shared = detail.shared;
    }
    if (d.rows) out.rows = rowsFromColumns(d.rows);
    return out;
  }

  function rowsFromColumns({ id = [], choice = [], phase = "", tokens = [], context = [] }) {
    return id.map((rid, i) => ({
      id: rid, choice: choice[i] || 0, phase: phase[i] === "p" ? "prefill" : "decode",
      tokens: tokens[i] || 0, context: context[i] || 0,
    }));
  }

  const HANDLERS = {
    hello(h) {
      conn.backoff = 0.5;
      hook.connected = true;
      setStatus("live");
      el.notice.hidden = true;
      el.model.textContent = h.model || "?";
      el.backend.textContent = h.backend || "?";
      state.droppedEarlier += state.droppedNow;
      state.droppedNow = 0;
      if (steps.size) steps.breakNext = "reconnect";
      resetLanes();
      syncClock(h.time);
      for (const r of h.requests || []) {
        const lane = addLane(r.id, r.state, r.arrival || h.time);
        lane.prompt = r.prompt_tokens;
        lane.completion = r.completion_tokens || 0;
        lane.arrival = r.arrival;
        lane.blocks = [];   // the snapshot's detail.tables fills them
      }
      applyCommon(h, h.time);
    },

    step(s) {
      hook.records += 1;
      syncClock(s.end);
      pushStep(s);
      const seen = new Set();
      for (const row of s.rows || []) applyRow(row, s, seen);
      for (const id of s.preempted_now || []) {
        const lane = lanes.get(id);
        if (!lane || lane.ended) continue;
        lane.preempted = true;
        lane.blocks = [];
        setLaneState(lane, "queued", s.start);
      }
      applyCommon(s, s.end, seen);
    },

    idle(d) {
      syncClock(d.time);
      applyCommon(d, d.time);
      if (!d.running && !d.waiting) {
        // Nothing in flight: a lane still open ended in records this viewer never got.
        for (const lane of lanes.values()) if (!lane.ended) endLane(lane, { reason: "unknown" }, d.time);
      }
    },

    dropped(d) {
      state.droppedNow = d.dropped || 0;
      invalidate("header");
    },
  };

  // The fields hello, step and idle share: counts, KV, queue and the requests that ended.
  function applyCommon(d, time, seen = new Set()) {
    if (typeof d.step === "number") state.step = hook.lastStep = d.step;
    if (typeof d.itl_target_ms === "number") state.itlTarget = d.itl_target_ms;
    state.running = d.running || 0;
    state.waiting = d.waiting || 0;
    if (d.preempted !== undefined) state.preempted = d.preempted || 0;
    if (d.kv) {
      const kv = { ...state.kv, ...d.kv };                 // map and shared may come less often
      if (kv.map.length !== kv.total) kv.map = "";         // another pool's map: wait for this one's
      state.kv = kv;
    }
    if (d.tables) applyTables(d.tables, seen);
    if (d.queue !== undefined) applyQueue(d, time, seen);
    for (const f of d.finished || []) {
      seen.add(f.id);
      endLane(lanes.get(f.id) || addLane(f.id, "queued", time), f, time);
    }
    // Only a record with the whole queue can tell that a request shows up nowhere.
    if (d.queue !== undefined && !state.queueMore) sweepUnseen(seen, time);
    ownerIndex = null;
    invalidate("header", "kv", "lanes");
  }

  function applyQueue(d, time, seen) {
    state.queue = d.queue || [];
    state.queueMore = d.queue_more || 0;
    state.queueAt = Date.now();
    // The queue is redrawn when its members change, and its waits once a second (the 1 s tick):
    // rewriting 64 waits on every step would lay the panel out twenty times a second.
    const queueKey = state.queue.map((e) => e.id + (e.preempted ? "!" : "")).join() + "+" + state.queueMore;
    if (queueKey !== state.queueKey) {
      state.queueKey = queueKey;
      invalidate("queue");
    }
    for (const entry of state.queue) applyQueueEntry(entry, time, seen);
  }

  // Each running request's block table (all its choices'); a request not in it holds none now.
  function applyTables(tables, seen) {
    for (const lane of lanes.values()) {
      if (!lane.ended) lane.blocks = tables[lane.id] || [];
    }
    for (const id in tables) seen.add(id);
  }

  function applyRow(row, s, seen) {
    let lane = lanes.get(row.id);
    if (lane?.ended) return;
    if (!lane) lane = addLane(row.id, row.phase, s.start);
    seen.add(row.id);
    lane.unseen = 0;
    if (!row.choice) lane.context = row.context;
    if (row.phase === "prefill") {
      lane.prefillContext = row.context;
      lane.prefillEnd = s.end;
    } else if (row.phase === "decode") {
      if (lane.prompt == null && lane.prefillContext != null) lane.prompt = lane.prefillContext;
      if (lane.prompt != null && !row.choice) lane.completion = Math.max(0, row.context - lane.prompt);
      if (lane.ttftSeen == null && lane.arrival && lane.prefillEnd) {
        lane.ttftSeen = (lane.prefillEnd - lane.arrival) * 1000;   // first token came with the last chunk
      }
    }
    lane.preempted = false;
    setLaneState(lane, row.phase, s.start);
  }

  function applyQueueEntry(entry, time, seen) {
    seen.add(entry.id);
    let lane = lanes.get(entry.id);
    if (lane?.ended) return;
    const arrival = time - (entry.waited_ms || 0) / 1000;
    if (!lane) lane = addLane(entry.id, "queued", arrival);
    if (!lane.arrival && !entry.preempted) lane.arrival = arrival;
    if (lane.prompt == null) lane.prompt = entry.prompt_tokens;
    lane.unseen = 0;
    lane.preempted = !!entry.preempted;
    if (lane.state !== "queued") lane.blocks = [];
    setLaneState(lane, "queued", time);              // no-op unless its state or preempted mark changed
  }

  // With the whole queue in view, an in-flight request that shows up nowhere for long has ended
  // in records this viewer lost; without this its lane would stay open forever.
  function sweepUnseen(seen, time) {
    for (const lane of lanes.values()) {
      if (lane.ended || seen.has(lane.id)) continue;
      if (++lane.unseen > STALE_RECORDS) endLane(lane, { reason: "unknown" }, time);
    }
  }

  // ---- timeline ring buffer -------------------------------------------------------------------
  function pushStep(s) {
    const gap = steps.breakNext || (steps.size && s.step !== steps.lastId + 1 ? "gap" : null);
    steps.buf[steps.head] = {
      id: s.step, prefill: s.prefill_tokens || 0, decode: s.decode_tokens || 0, rows: (s.rows || []).length,
      ms: s.duration_ms || 0, predicted: s.predicted_ms || 0, target: s.itl_target_ms || 0, gap,
    };
    steps.head = (steps.head + 1) % STEPS_KEPT;
    steps.size = Math.min(STEPS_KEPT, steps.size + 1);
    steps.lastId = s.step;
    steps.breakNext = null;
    invalidate("timeline");
  }

  // k = 0 is the newest step.
  const stepAt = (k) => steps.buf[(steps.head - 1 - k + STEPS_KEPT) % STEPS_KEPT];

  // ---- lanes ------------------------------------------------------------------------------------
  function addLane(id, laneState, time) {
    const lane = {
      id, state: laneState, prompt: null, completion: 0, arrival: null, blocks: [], segments: [],
      ttft: null, ttftSeen: null, reason: null, error: null, preempted: false, ended: false, unseen: 0,
      prefillContext: null, prefillEnd: null, context: null, endTime: null, ui: null, shown: {},
    };
    lane.segments.push({ kind: laneState, t0: time, t1: null });
    lanes.set(id, lane);
    lane.ui = makeLaneElement(lane);
    el.lanes.insertBefore(lane.ui.root, ended.length ? ended[0].ui.root : null);  // in flight first
    return lane;
  }

  // Server ids are long ("chatcmpl-" + 32 hex digits): keep the head and the tail.
  const shortId = (id) => (id.length > 20 ? `${id.slice(0, 13)}…${id.slice(-5)}` : id);

  function makeLaneElement(lane) {
    const root = document.createElement("div");
    root.className = "lane";
    root.dataset.requestId = lane.id;
    root.dataset.state = lane.state;
    root.innerHTML = '<span class="l-id"></span><span class="l-state"></span><span class="l-tok"></span>'
      + '<span class="l-ttft"></span><span class="l-bar"></span>';
    const [id, st, tok, ttft, bar] = root.children;
    id.textContent = shortId(lane.id);
    id.title = lane.id;
    return { root, st, tok, ttft, bar };
  }

  function setLaneState(lane, laneState, time) {
    const kind = laneState === "queued" && lane.preempted ? "preempt" : laneState;
    const last = lane.segments[lane.segments.length - 1];
    if (lane.state === laneState && last?.kind === kind) return;
    if (last) last.t1 = Math.max(last.t0, time);
    lane.segments.push({ kind, t0: time, t1: null });
    if (lane.segments.length > SEGMENTS_KEPT) lane.segments.shift();
    lane.state = lane.ui.root.dataset.state = laneState;
    updateLaneText(lane);                   // a change of state shows at once, counts at 4 Hz
  }

  function endLane(lane, f, time) {
    if (lane.ended) return;
    const failed = f.reason === "abort" || f.reason === "error" || !!f.error;
    const last = lane.segments[lane.segments.length - 1];
    if (last) last.t1 = Math.max(last.t0, time);
    lane.state = lane.ui.root.dataset.state = failed ? "aborted" : "finished";
    lane.ended = true;
    lane.endTime = time;
    lane.reason = f.reason || null;
    lane.error = f.error || null;
    if (f.ttft_ms != null) lane.ttft = f.ttft_ms;
    if (f.prompt_tokens != null) lane.prompt = f.prompt_tokens;
    if (f.completion_tokens != null) lane.completion = f.completion_tokens;
    updateLaneText(lane);
    // lane.blocks stays: hovering an ended lane still shows where its KV was (now cached or free).
    // Newest ended lane goes first among the ended ones; the oldest beyond the limit goes.
    el.lanes.insertBefore(lane.ui.root, ended.length ? ended[0].ui.root : null);
    ended.unshift(lane);
    if (ended.length > ENDED_KEPT) removeLane(ended.pop());
  }

  function removeLane(lane) {
    lane.ui.root.remove();
    lanes.delete(lane.id);
  }

  function resetLanes() {
    for (const lane of lanes.values()) removeLane(lane);
    ended.length = 0;
    hover.lane = null;
    setHighlight(null);
  }

  // ---- rendering: at most once a frame, only what changed ----------------------------------------
  function invalidate(...parts) {
    for (const p of parts) dirty.add(p);
    if (!frame) frame = requestAnimationFrame(render);
  }

  function render() {
    frame = 0;
    const parts = new Set(dirty);
    dirty.clear();
    if (parts.has("header")) renderHeader();
    if (parts.has("queue")) renderQueue();
    if (parts.has("lanes")) renderLanesSoon();
    if (parts.has("kv")) renderKV();
    if (parts.has("timeline")) drawTimeline();
  }

  function setText(node, text) {
    text = String(text);
    if (node.textContent !== text) node.textContent = text;
  }

  function renderHeader() {
    setText(el.step, state.step);
    setText(el.running, state.running);
    setText(el.waiting, state.waiting);
    setText(el.preempted, state.preempted);
    setText(el.dropped, state.droppedEarlier + state.droppedNow);
    setText(el.itl, state.itlTarget === null ? "—" : state.itlTarget > 0 ? `${fmtNumber(state.itlTarget)} ms` : "none");
  }

  const fmtWait = (ms) => (ms < 1000 ? "<1 s" : ms < 120000 ? `${Math.floor(ms / 1000)} s` : `${Math.floor(ms / 60000)} min`);
  const fmtNumber = (x) => (Number.isInteger(x) ? String(x) : x.toFixed(1));
  const fmtMs = (ms) => (ms >= 9950 ? `${Math.round(ms / 1000)} s` : ms >= 999.5 ? `${(ms / 1000).toFixed(1)} s`
    : `${Math.round(ms)} ms`);

  function renderQueue() {
    const entries = state.queue;
    const list = el.queue;
    const elapsed = Date.now() - state.queueAt;
    while (list.children.length > entries.length) list.lastChild.remove();
    while (list.children.length < entries.length) {
      const li = document.createElement("li");
      li.innerHTML = '<span class="q-id"></span><span class="q-tok"></span><span class="q-wait"></span>';
      list.appendChild(li);
    }
    entries.forEach((entry, i) => {
      const li = list.children[i];
      if (li.dataset.requestId !== entry.id) li.dataset.requestId = entry.id;
      li.classList.toggle("preempted", !!entry.preempted);
      setText(li.children[0], shortId(entry.id));
      if (li.title !== entry.id) li.title = entry.id;
      setText(li.children[1], `${entry.prompt_tokens} tok`);
      setText(li.children[2], fmtWait((entry.waited_ms || 0) + elapsed));
    });
    el.queueMore.hidden = !state.queueMore;
    setText(el.queueMore, `+${state.queueMore} more`);
    el.queueEmpty.hidden = entries.length > 0;
  }

  // Lanes repaint at most four times a second: a step moves every decoding lane's count and bar,
  // and repainting the list on every one was most of the page's cost; 4 Hz still looks live.
  // (A lane's data-state changes at once, in setLaneState and endLane.)
  const LANES_EVERY_MS = 250;
  let lanesShownAt = -Infinity, lanesTimer = 0;

  function renderLanesSoon() {
    const wait = lanesShownAt + LANES_EVERY_MS - performance.now();
    if (wait > 0) {
      if (!lanesTimer) lanesTimer = setTimeout(() => { lanesTimer = 0; invalidate("lanes"); }, wait);
      return;
    }
    lanesShownAt = performance.now();
    renderLanes();
  }

  function renderLanes() {
    const now = serverNow();
    for (const lane of lanes.values()) {
      updateLaneText(lane);
      const bar = laneBar(lane, now);
      if (lane.shown.bar !== bar) lane.ui.bar.style.backgroundImage = lane.shown.bar = bar;
    }
  }

  // Touches the DOM only where a value changed since the lane was last shown.
  function updateLaneText(lane) {
    const { ui, shown } = lane;
    const label = lane.ended ? `${lane.state}${lane.reason ? " · " + lane.reason : ""}`
      : lane.state === "queued" && lane.preempted ? "queued · preempted" : lane.state;
    if (shown.label !== label) {
      ui.st.textContent = shown.label = label;
      ui.st.title = lane.error || label;
    }
    // First seen mid-decode (records dropped, or connected late): only its context size is known.
    setText(ui.tok, lane.prompt != null ? `${lane.prompt} / ${lane.completion}`
      : lane.context != null ? `${lane.context} ctx` : "");
    const ttft = lane.ttft != null ? fmtMs(lane.ttft) : lane.ttftSeen != null ? "~" + fmtMs(lane.ttftSeen) : "";
    setText(ui.ttft, ttft);
  }

  // A lane's history on the shared time axis, as one hard-stop gradient: a dozen small canvases
  // repainted every step cost the page more than everything else together.
  function laneBar(lane, now) {
    const from = now - LANE_WINDOW_S;
    const pct = (t) => Math.max(0, Math.min(100, ((t - from) / LANE_WINDOW_S) * 100));
    const stops = [];
    let at = 0;
    for (const seg of lane.segments) {
      const end = seg.t1 ?? (lane.ended ? lane.endTime : now);
      if (end < from) continue;
      const a = Math.max(at, pct(seg.t0)), b = Math.max(a + 0.4, pct(end));   // at least a sliver
      if (a > at) stops.push(`transparent ${at.toFixed(1)}% ${a.toFixed(1)}%`);
      stops.push(`${C[seg.kind] || C.queued} ${a.toFixed(1)}% ${b.toFixed(1)}%`);
      at = b;
    }
    if (!stops.length) return "none";
    if (at < 100) stops.push(`transparent ${at.toFixed(1)}% 100%`);
    return `linear-gradient(to right, ${stops.join(", ")})`;
  }

  // ---- KV block map -----------------------------------------------------------------------------
  function kvLayout(total) {
    const width = sizes.kv;
    for (const cell of KV_CELLS) {
      const cols = Math.max(1, Math.floor(width / cell));
      const rows = Math.ceil(total / cols);
      const smallest = cell === KV_CELLS[KV_CELLS.length - 1];
      if (rows * cell <= Math.max(sizes.kvHeight, KV_MIN_HEIGHT) || smallest) return { cell, cols, rows };
    }
  }

  function renderKV() {
    const kv = state.kv;
    for (const name of ["total", "used", "cached", "shared", "free"]) setText(el.kvCount[name], kv[name] ?? 0);
    hook.kv = { total: kv.total, used: kv.used, cached: kv.cached, shared: kv.shared, free: kv.free };
    if (hover.kv) showKVTooltip(hover.kv);     // owners may have changed under a still mouse
    drawKV();
  }

  // The grid is drawn incrementally: each cell's drawn look (state, highlighted, hovered) is
  // remembered, and a record repaints only the cells whose look changed (a few dozen a step,
  // where a full repaint would be thousands of rectangles twenty times a second).
  const KV_CODE = { ".": 0, c: 1, u: 2, s: 3 };
  const KV_CHARS = ".cus";
  const kvDrawn = { key: "", looks: new Uint8Array(0) };

  function drawKV() {
    const map = state.kv.map || "";
    const total = map.length;
    if (!sizes.kv) return;
    const layout = kvLayout(Math.max(total, 1));
    const height = Math.max(layout.rows * layout.cell, 20);
    const key = `${sizes.kv}x${height}/${layout.cell}/${total}/${window.devicePixelRatio}`;
    const ctx = el.kvmap.getContext("2d");
    if (key !== kvDrawn.key) {            // new size or block count: start from a blank canvas
      fitCanvas(el.kvmap, sizes.kv, height);
      kvDrawn.key = key;
      kvDrawn.looks = new Uint8Array(total).fill(255);
    }
    const lane = hover.highlight && lanes.get(hover.highlight);
    const lit = new Set(lane ? lane.blocks : []);
    const hovered = hover.kv ? hover.kv.block : -1;
    const looks = kvDrawn.looks;
    for (let i = 0; i < total; i++) {
      const look = (KV_CODE[map[i]] ?? 0) | (lit.has(i) ? 4 : 0) | (i === hovered ? 8 : 0);
      if (look !== looks[i]) {
        drawCell(ctx, layout, i, look);
        looks[i] = look;
      }
    }
  }

  function drawCell(ctx, { cell, cols }, i, look) {
    const gap = cell >= 6 ? 1 : 0;
    const x = (i % cols) * cell, y = Math.floor(i / cols) * cell, size = cell - gap;
    ctx.fillStyle = look & 4 ? C.highlight : C.kv[KV_CHARS[look & 3]];
    ctx.fillRect(x, y, size, size);
    if (look & 12 && size >= 3) {         // highlighted or hovered: an outline inside the cell
      ctx.strokeStyle = C.line;
      ctx.lineWidth = look & 8 ? 2 : 1;
      const inset = ctx.lineWidth / 2;
      ctx.strokeRect(x + inset, y + inset, size - 2 * inset, size - 2 * inset);
    }
  }

  // Which in-flight requests hold each block, from their latest block tables.
  function owners(block) {
    if (!ownerIndex) {
      ownerIndex = new Map();
      for (const lane of lanes.values()) {
        if (lane.ended) continue;
        for (const b of lane.blocks) {
          const list = ownerIndex.get(b);
          if (!list) ownerIndex.set(b, [lane.id]); else if (list.at(-1) !== lane.id) list.push(lane.id);
        }
      }
    }
    return ownerIndex.get(block) || [];
  }

  function kvCellAt(event) {
    const map = state.kv.map || "";
    const rect = el.kvmap.getBoundingClientRect();
    const { cell, cols } = kvLayout(Math.max(map.length, 1));
    const col = Math.floor((event.clientX - rect.left) / cell);
    const block = Math.floor((event.clientY - rect.top) / cell) * cols + col;
    return col < cols && block >= 0 && block < map.length ? block : null;
  }

  function showKVTooltip(pos) {
    const map = state.kv.map || "";
    if (pos.block >= map.length) return hideTooltip();
    const ids = owners(pos.block);
    const lines = [`block ${pos.block} — ${KV_NAMES[map[pos.block]] || map[pos.block]}`];
    for (const id of ids.slice(0, 6)) lines.push(`${id} (${lanes.get(id)?.state || "?"})`);
    if (ids.length > 6) lines.push(`+${ids.length - 6} more`);
    showTooltip(lines, pos.x, pos.y);
    setHighlight(ids[0] || null);
  }

  el.kvmap.addEventListener("mousemove", (event) => {
    const block = kvCellAt(event);
    if (block === null) return leaveKV();
    hover.kv = { block, x: event.clientX, y: event.clientY };
    showKVTooltip(hover.kv);
    invalidate("kv");
  });
  el.kvmap.addEventListener("mouseleave", leaveKV);

  function leaveKV() {
    if (!hover.kv) return;
    hover.kv = null;
    hideTooltip();
    setHighlight(hover.lane);
    invalidate("kv");
  }

  // One request at a time is highlighted: its lane and its blocks in the grid.
  function setHighlight(id) {
    if (hover.highlight === id) return;
    lanes.get(hover.highlight)?.ui.root.classList.remove("highlight");
    hover.highlight = hook.highlight = id;
    lanes.get(id)?.ui.root.classList.add("highlight");
    invalidate("kv");
  }

  el.lanes.addEventListener("mouseover", (event) => {
    const root = event.target.closest(".lane");
    hover.lane = root ? root.dataset.requestId : null;
    setHighlight(hover.lane);
  });
  el.lanes.addEventListener("mouseleave", () => {
    hover.lane = null;
    setHighlight(null);
  });

  // ---- tooltip ----------------------------------------------------------------------------------
  function showTooltip(lines, x, y) {
    const tip = el.tooltip;
    tip.textContent = lines.join("\n");
    tip.hidden = false;
    const left = Math.min(x + 14, window.innerWidth - tip.offsetWidth - 8);
    tip.style.left = `${Math.max(4, left)}px`;
    tip.style.top = `${y + 16}px`;
  }

  function hideTooltip() {
    el.tooltip.hidden = true;
  }

  // ---- timeline ---------------------------------------------------------------------------------
  const TL = { height: 230, left: 46, right: 50, top: 22, bottom: 20 };

  // Rounds up to a value whose quarters (the grid lines) are round numbers.
  function niceCeil(x) {
    if (!(x > 0)) return 1;
    const p = 10 ** Math.floor(Math.log10(x));
    for (const m of [1, 1.2, 1.6, 2, 2.4, 3.2, 4, 4.8, 6, 8, 10]) if (m * p >= x * 0.9999) return m * p;
    return 10 * p;
  }

  function drawTimeline() {
    const width = sizes.timeline;
    if (!width) return;
    const ctx = fitCanvas(el.timeline, width, TL.height);
    const plotW = width - TL.left - TL.right, plotH = TL.height - TL.top - TL.bottom;
    const n = Math.min(steps.size, STEPS_SHOWN);
    const slot = plotW / STEPS_SHOWN;
    const target = n ? stepAt(0).target : state.itlTarget || 0;
    let tokMax = 1, msMax = target * 1.5;
    for (let k = 0; k < n; k++) {
      const s = stepAt(k);
      tokMax = Math.max(tokMax, s.prefill + s.decode);
      msMax = Math.max(msMax, s.ms, s.predicted);
    }
    tokMax = niceCeil(tokMax);
    msMax = niceCeil(msMax);
    const yTok = (v) => TL.top + plotH - (v / tokMax) * plotH;
    const yMs = (v) => TL.top + plotH - (Math.min(v, msMax) / msMax) * plotH;
    const xAt = (k) => TL.left + plotW - (k + 1) * slot;    // left edge of the k-th newest slot

    // grid and both axes' labels
    ctx.font = "11px system-ui, sans-serif";
    ctx.textBaseline = "middle";
    ctx.lineWidth = 1;
    for (let i = 0; i <= 4; i++) {
      const y = Math.round(TL.top + plotH - (i / 4) * plotH) + 0.5;
      ctx.strokeStyle = C.grid;
      ctx.beginPath(); ctx.moveTo(TL.left, y); ctx.lineTo(TL.left + plotW, y); ctx.stroke();
      ctx.fillStyle = C.faint;
      ctx.textAlign = "right";
      ctx.fillText(fmtAxis((tokMax * i) / 4), TL.left - 6, y);
      ctx.textAlign = "left";
      ctx.fillText(fmtAxis((msMax * i) / 4), TL.left + plotW + 6, y);
    }
    ctx.textAlign = "right";
    ctx.fillText("tokens", TL.left - 6, TL.top - 14);
    ctx.textAlign = "left";
    ctx.fillText("ms", TL.left + plotW + 6, TL.top - 14);
    if (!n) {
      ctx.textAlign = "center";
      ctx.fillText("no engine steps yet", TL.left + plotW / 2, TL.top + plotH / 2);
      return;
    }

    // steps over the target get a tinted column; breaks (drops, reconnects) a dashed line
    const bw = Math.max(1, slot - (slot > 3 ? 1 : 0));
    const decode = new Path2D(), prefill = new Path2D(), over = new Path2D();
    const breaks = [];
    for (let k = 0; k < n; k++) {
      const s = stepAt(k), x = xAt(k);
      if (s.target > 0 && s.ms > s.target) over.rect(x, TL.top, slot, plotH);
      const yd = yTok(s.decode), yp = yTok(s.decode + s.prefill);
      decode.rect(x, yd, bw, TL.top + plotH - yd);
      prefill.rect(x, yp, bw, yd - yp);
      if (s.gap) breaks.push([x, s.gap]);
    }
    ctx.fillStyle = C.over + "22";
    ctx.fill(over);
    ctx.fillStyle = C.decode;
    ctx.fill(decode);
    ctx.fillStyle = C.prefill;
    ctx.fill(prefill);
    for (const [x, kind] of breaks) {
      ctx.strokeStyle = kind === "reconnect" ? C.line : C.faint;
      ctx.setLineDash([3, 3]);
      ctx.beginPath(); ctx.moveTo(Math.round(x) + 0.5, TL.top); ctx.lineTo(Math.round(x) + 0.5, TL.top + plotH); ctx.stroke();
    }
    ctx.setLineDash([]);

    plotLine(ctx, n, (s) => s.predicted, yMs, xAt, slot, C.faint, 1);
    plotLine(ctx, n, (s) => s.ms, yMs, xAt, slot, "rgba(255, 255, 255, 0.8)", 3.5);   // a halo over the bars
    plotLine(ctx, n, (s) => s.ms, yMs, xAt, slot, C.line, 1.5);
    ctx.fillStyle = C.over;
    for (let k = 0; k < n; k++) {
      const s = stepAt(k);
      if (s.target > 0 && s.ms > s.target) {
        ctx.beginPath(); ctx.arc(xAt(k) + slot / 2, yMs(s.ms), 2.5, 0, 2 * Math.PI); ctx.fill();
      }
    }
    if (target > 0) {
      const y = Math.round(yMs(target)) + 0.5;
      ctx.strokeStyle = C.over;
      ctx.setLineDash([6, 4]);
      ctx.beginPath(); ctx.moveTo(TL.left, y); ctx.lineTo(TL.left + plotW, y); ctx.stroke();
      ctx.setLineDash([]);
      // the label sits on a light plate so the bars under it do not hide it
      const label = `ITL target ${fmtNumber(target)} ms`;
      const w = ctx.measureText(label).width + 8;
      ctx.fillStyle = "rgba(255, 255, 255, 0.85)";
      ctx.fillRect(TL.left + plotW - w - 2, y - 15, w, 13);
      ctx.fillStyle = C.over;
      ctx.textAlign = "right";
      ctx.textBaseline = "bottom";
      ctx.fillText(label, TL.left + plotW - 6, y - 2);
    }
    ctx.fillStyle = C.faint;
    ctx.textBaseline = "middle";
    ctx.textAlign = "right";
    ctx.fillText(`step ${stepAt(0).id}`, TL.left + plotW, TL.top + plotH + 12);
    ctx.textAlign = "left";
    if (n > 60) ctx.fillText(`step ${stepAt(n - 1).id}`, xAt(n - 1), TL.top + plotH + 12);
  }

  const fmtAxis = (v) => (v >= 10000 ? `${+(v / 1000).toFixed(1)}k` : String(+v.toFixed(2)));

  // A polyline through each step's value; entries with no value (0, e.g. no prediction) break it.
  function plotLine(ctx, n, value, y, xAt, slot, stroke, lineWidth) {
    ctx.strokeStyle = stroke;
    ctx.lineWidth = lineWidth;
    ctx.beginPath();
    let drawing = false;
    for (let k = n - 1; k >= 0; k--) {
      const s = stepAt(k), v = value(s);
      const x = xAt(k) + slot / 2;
      if (!(v > 0) || s.gap) drawing = false;
      if (!(v > 0)) continue;
      if (drawing) ctx.lineTo(x, y(v)); else ctx.moveTo(x, y(v));
      drawing = true;
    }
    ctx.stroke();
  }

  el.timeline.addEventListener("mousemove", (event) => {
    const rect = el.timeline.getBoundingClientRect();
    const plotW = sizes.timeline - TL.left - TL.right;
    const k = Math.floor((TL.left + plotW - (event.clientX - rect.left)) / (plotW / STEPS_SHOWN));
    if (k < 0 || k >= Math.min(steps.size, STEPS_SHOWN)) return hideTooltip();
    const s = stepAt(k);
    const pred = s.predicted > 0 ? ` (predicted ${s.predicted.toFixed(1)})` : "";
    showTooltip([`step ${s.id}: ${s.ms.toFixed(1)} ms${pred}`,
      `prefill ${s.prefill} + decode ${s.decode} tokens, ${s.rows} rows`], event.clientX, event.clientY);
  });
  el.timeline.addEventListener("mouseleave", hideTooltip);

  // ---- canvas sizing ----------------------------------------------------------------------------
  // Sizes the backing store for the device pixel ratio (only when it changes) and clears it.
  function fitCanvas(canvas, width, height) {
    const dpr = window.devicePixelRatio || 1;
    const w = Math.round(width * dpr), h = Math.round(height * dpr);
    if (canvas.width !== w || canvas.height !== h) {
      canvas.width = w;
      canvas.height = h;
      canvas.style.height = `${height}px`;
    }
    const ctx = canvas.getContext("2d");
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, width, height);
    return ctx;
  }

  // Widths come from ResizeObserver, so drawing never has to read layout.
  const resizeObserver = new ResizeObserver((entries) => {
    for (const entry of entries) {
      const width = Math.floor(entry.contentRect.width);
      if (entry.target === el.timeline.parentElement && width !== sizes.timeline) {
        sizes.timeline = width;
        invalidate("timeline");
      } else if (entry.target === el.kvmap.parentElement) {
        // The box takes the panel's free height (CSS), so the grid's cells can grow to fill it.
        const height = Math.floor(entry.contentRect.height);
        if (width === sizes.kv && height === sizes.kvHeight) continue;
        sizes.kv = width;
        sizes.kvHeight = height;
        invalidate("kv");
      }
    }
  });
  resizeObserver.observe(el.timeline.parentElement);
  resizeObserver.observe(el.kvmap.parentElement);

  setStatus("connecting");
  invalidate("header", "timeline", "kv", "queue");
  connect();
})();
