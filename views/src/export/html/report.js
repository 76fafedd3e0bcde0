// gpuprof's report page: reads the report's JSON (made by `gpuprof export --format html`) and
// draws the timelines (uPlot), the icicle graph of live memory by stack at the instant picked,
// the tables and the findings. Everything it shows is in the file; it asks nothing of a network.
"use strict";
(function () {
  const started = performance.now();
  const data = JSON.parse(document.getElementById("gpuprof-data").textContent);
  const NS = 1e9;
  const byId = (id) => document.getElementById(id);
  const S = data.stacks;
  const KIND_TENSORS = 0;
  // What an allocator reserves beyond its live blocks: shown beside the tensors.
  const KIND_CACHE = data.kinds.indexOf("cache");
  const countedWithTensors = (k) => k === KIND_TENSORS || k === KIND_CACHE;

  // ---- words and numbers -------------------------------------------------------------------

  // As gpuprof's tables write bytes (model/src/bytes.rs).
  function human(bytes) {
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let value = Math.abs(bytes), unit = 0;
    while (value >= 1024 && unit + 1 < units.length) { value /= 1024; unit += 1; }
    const sign = bytes < 0 ? "-" : "";
    return unit === 0 ? `${bytes} B` : `${sign}${value.toFixed(1)} ${units[unit]}`;
  }
  const seconds = (t) => `${(t / NS).toFixed(3)} s`;
  const basename = (file) => file.slice(file.lastIndexOf("/") + 1);

  function cell(row, content, className, title) {
    const td = document.createElement("td");
    td.textContent = content;
    if (className) td.className = className;
    if (title) td.title = title;
    row.appendChild(td);
    return td;
  }
  function header(table, names) {
    table.textContent = "";
    const row = table.createTHead().insertRow();
    for (const name of names) {
      const th = document.createElement("th");
      th.textContent = name;
      if (/bytes|size|blocks|value|at |change|time|peak|^rank$/i.test(name)) th.className = "num";
      row.appendChild(th);
    }
    return table.createTBody();
  }

  const processLabel = (i) => {
    const p = data.processes[i];
    return `pid ${p.pid} ${p.comm}${p.rank === undefined ? "" : ` (rank ${p.rank})`}`;
  };
  const kindLabel = (k) => (k === KIND_CACHE ? "allocator's cache (reserved, no live tensor)" : data.kinds[k]);
  const METRIC_LABEL = { allocated: "allocated (tensors)", reserved: "reserved (allocator's cache included)", driver: "driver allocations" };
  const curveLabel = (c) => `${processLabel(c.process)} · GPU ${c.device === null ? "?" : c.device} · ${METRIC_LABEL[c.metric]}`;

  // ---- stacks ------------------------------------------------------------------------------

  const paths = new Map();
  // Frame indices of a trie node, outermost first.
  function pathOf(node) {
    if (node === 0) return [];
    let path = paths.get(node);
    if (!path) {
      path = pathOf(S.parent[node]).concat([S.frame[node]]);
      paths.set(node, path);
    }
    return path;
  }
  function frameName(f) {
    if (S.class[f] === "native") return S.function[f];
    if (S.class[f] === "autograd") return `${S.function[f]} (backward)`;
    return `${S.function[f]} (${basename(S.file[f])}:${S.line[f]})`;
  }
  function frameWhere(f) {
    if (S.class[f] === "native") return `${S.function[f]}: native code, no Python frame`;
    if (S.class[f] === "autograd") return `backward of ${S.function[f]}: below it, the forward call that made it`;
    return `${S.file[f]}:${S.line[f]} in ${S.function[f]}`;
  }
  // The user's own line: the innermost frame of the user's code, else the innermost frame.
  function userLine(node) {
    const path = pathOf(node);
    for (let i = path.length - 1; i >= 0; i--) {
      if (S.class[path[i]] === "user") return `${basename(S.file[path[i]])}:${S.line[path[i]]} in ${S.function[path[i]]}`;
    }
    return path.length ? frameName(path[path.length - 1]) : "(no Python stack)";
  }
  const stackText = (node) => pathOf(node).slice().reverse().map(frameWhere).join("\n") || "(no Python stack)";

  // ---- state ---------------------------------------------------------------------------------

  const state = { process: "all", layer: data.initial.layer, pick: null, zoom: [] };
  const shown = (p) => data.processes[p].cuda && (state.process === "all" || state.process === p);

  function valueAt(curve, t) {
    let lo = 0, hi = curve.t.length - 1, found = -1;
    while (lo <= hi) {
      const mid = (lo + hi) >> 1;
      if (curve.t[mid] <= t) { found = mid; lo = mid + 1; } else hi = mid - 1;
    }
    return found < 0 ? null : curve.v[found];
  }

  // The snapshot an instant shows: the last taken at or before it.
  function snapshotAt(t) {
    let lo = 0, hi = data.snapshots.length - 1, found = -1;
    while (lo <= hi) {
      const mid = (lo + hi) >> 1;
      if (data.snapshots[mid].t <= t) { found = mid; lo = mid + 1; } else hi = mid - 1;
    }
    return found;
  }

  function countsTensors(snapshot, p) {
    if (state.layer === "tensors") return true;
    if (state.layer === "driver") return false;
    return snapshot.tensors.includes(p);
  }

  // Entries of a snapshot the view counts: {p, k, n, b, c}.
  function entries(index) {
    const out = [];
    if (index < 0) return out;
    const s = data.snapshots[index];
    for (let i = 0; i < s.p.length; i++) {
      const p = s.p[i], k = s.k[i];
      if (!shown(p) || countedWithTensors(k) !== countsTensors(s, p)) continue;
      out.push({ p, k, n: s.n[i], b: s.b[i], c: s.c[i] });
    }
    return out;
  }

  // The instants the pick shows, as recorded (the snapshots' own): {index, t} or {from, to,
  // fromIndex, index}. Curves and stacks are read there, where both are exact.
  function recorded() {
    const pick = state.pick;
    if (pick.from === undefined) {
      const index = pick.snapshot !== undefined ? pick.snapshot : Math.max(0, snapshotAt(pick.t));
      return { index, t: data.snapshots[index].t };
    }
    const fromIndex = Math.max(0, snapshotAt(pick.from)), index = Math.max(0, snapshotAt(pick.to));
    return { fromIndex, index, from: data.snapshots[fromIndex].t, to: data.snapshots[index].t };
  }

  // What the picked instant or range shows: entries (for a range, what grew over it), blocks.
  function view() {
    const r = recorded();
    if (r.from === undefined) return { rows: entries(r.index), blocks: blocks(r.index, null) };
    const before = new Map(entries(r.fromIndex).map((e) => [`${e.p}:${e.k}:${e.n}`, e]));
    const rows = [];
    for (const e of entries(r.index)) {
      const old = before.get(`${e.p}:${e.k}:${e.n}`);
      const grew = e.b - (old ? old.b : 0);
      if (grew > 0) rows.push({ p: e.p, k: e.k, n: e.n, b: grew, c: e.c - (old ? old.c : 0) });
    }
    rows.sort((x, y) => y.b - x.b);
    return { rows, blocks: blocks(r.index, r.from) };
  }

  function blocks(index, since) {
    const out = [];
    if (index < 0) return out;
    const s = data.snapshots[index], bl = s.blocks;
    for (let i = 0; i < bl.p.length; i++) {
      const p = bl.p[i], k = bl.k[i];
      if (!shown(p) || (k === KIND_TENSORS) !== countsTensors(s, p)) continue;
      if (since !== null && bl.since[i] <= since) continue;
      out.push({ p, k, n: bl.n[i], size: bl.size[i], addr: bl.addr[i], since: bl.since[i] });
    }
    return out;
  }

  // ---- the timeline --------------------------------------------------------------------------

  const PALETTE = ["#3366cc", "#dc3912", "#109618", "#990099", "#0099c6", "#dd4477", "#66aa00", "#b82e2e", "#316395", "#994499"];
  const DASH = { allocated: [], reserved: [6, 3], driver: [2, 3] };
  const MARKER_COLOR = { start: "#2e9e5b", exit: "#7a8494", finding: "#d6a019", oom: "#d0342c" };
  let chart = null, curves = [], justSelected = false;

  function buildChart() {
    const box = byId("timeline");
    if (chart) { chart.destroy(); chart = null; }
    byId("zoom-out").disabled = true;
    box.textContent = "";
    curves = data.curves.filter((c) => shown(c.process));
    if (!curves.length) {
      box.textContent = "No GPU memory was held by the processes shown.";
      return;
    }
    const times = new Set([0, data.span]);
    for (const c of curves) for (const t of c.t) times.add(t);
    const xs = Float64Array.from(times).sort();
    const columns = [Array.from(xs, (t) => t / NS)];
    for (const c of curves) {
      const ys = new Array(xs.length);
      let j = -1;
      for (let i = 0; i < xs.length; i++) {
        while (j + 1 < c.t.length && c.t[j + 1] <= xs[i]) j++;
        ys[i] = j < 0 ? null : c.v[j];
      }
      columns.push(ys);
    }
    const colorOf = new Map();
    const series = [{ label: "time", value: (u, v) => (v == null ? "—" : `${v.toFixed(3)} s`) }];
    for (const c of curves) {
      const key = `${c.process}:${c.device}`;
      if (!colorOf.has(key)) colorOf.set(key, PALETTE[colorOf.size % PALETTE.length]);
      series.push({
        label: curveLabel(c),
        stroke: colorOf.get(key),
        width: 1.5,
        dash: DASH[c.metric],
        paths: uPlot.paths.stepped({ align: 1 }),
        points: { show: false },
        value: (u, v) => (v == null ? "—" : human(v)),
      });
    }
    chart = new uPlot({
      width: Math.max(400, box.clientWidth),
      height: 320,
      scales: { x: { time: false } },
      axes: [
        { label: "seconds after the first event" },
        { size: 80, values: (u, splits) => splits.map((v) => human(v)) },
      ],
      series,
      cursor: { drag: { x: true, y: false, setScale: false } },
      hooks: { draw: [drawMarks], setSelect: [selected], setCursor: [hoverMarker] },
    }, columns, box);
    chart.over.addEventListener("click", () => {
      if (justSelected) { justSelected = false; return; }
      const left = chart.cursor.left;
      if (left == null || left < 0) return;
      pick({ t: clamp(Math.round(chart.posToVal(left, "x") * NS)) });
    });
    chart.over.addEventListener("mouseleave", () => { byId("marker-tip").hidden = true; });
  }

  const clamp = (t) => Math.min(Math.max(t, 0), data.span);

  function visibleMarkers() {
    return data.markers.filter((m) => shown(m.process));
  }

  function drawMarks(u) {
    const ctx = u.ctx, top = u.bbox.top, height = u.bbox.height, dpr = devicePixelRatio || 1;
    const xOf = (t) => Math.round(u.valToPos(t / NS, "x", true));
    ctx.save();
    const pick = state.pick ? recorded() : null;
    if (pick && pick.from !== undefined) {
      ctx.fillStyle = "rgba(29, 35, 48, 0.08)";
      ctx.fillRect(xOf(pick.from), top, xOf(pick.to) - xOf(pick.from), height);
    }
    for (const m of visibleMarkers()) {
      const x = xOf(m.t);
      ctx.strokeStyle = MARKER_COLOR[m.kind];
      ctx.fillStyle = MARKER_COLOR[m.kind];
      ctx.lineWidth = (m.kind === "oom" ? 2 : 1) * dpr;
      ctx.beginPath();
      ctx.moveTo(x, top);
      ctx.lineTo(x, top + height);
      ctx.stroke();
      ctx.beginPath();
      ctx.moveTo(x - 5 * dpr, top);
      ctx.lineTo(x + 5 * dpr, top);
      ctx.lineTo(x, top + 7 * dpr);
      ctx.fill();
    }
    if (pick) {
      ctx.strokeStyle = "#1d2330";
      ctx.lineWidth = 2 * dpr;
      for (const t of pick.from !== undefined ? [pick.from, pick.to] : [pick.t]) {
        ctx.beginPath();
        ctx.moveTo(xOf(t), top);
        ctx.lineTo(xOf(t), top + height);
        ctx.stroke();
      }
    }
    ctx.restore();
  }

  function markerText(m) {
    const who = processLabel(m.process);
    if (m.kind === "start") return `${seconds(m.t)}: ${who} starts`;
    if (m.kind === "exit") return `${seconds(m.t)}: ${who} exits`;
    const f = data.findings[m.finding];
    return `${seconds(m.t)}: ${f.kind} [${f.severity}] ${who}\n${f.detail}`;
  }

  function hoverMarker(u) {
    const tip = byId("marker-tip"), left = u.cursor.left;
    if (left == null || left < 0) { tip.hidden = true; return; }
    const near = visibleMarkers().filter((m) => Math.abs(u.valToPos(m.t / NS, "x") - left) <= 3);
    if (!near.length) { tip.hidden = true; return; }
    tip.textContent = near.slice(0, 6).map(markerText).join("\n\n");
    const box = u.over.getBoundingClientRect();
    tip.style.left = `${box.left + left + 12}px`;
    tip.style.top = `${box.top + 8}px`;
    tip.hidden = false;
  }

  function selected(u) {
    if (u.select.width < 3) return;
    justSelected = true;
    const from = clamp(Math.round(u.posToVal(u.select.left, "x") * NS));
    const to = clamp(Math.round(u.posToVal(u.select.left + u.select.width, "x") * NS));
    u.setSelect({ left: 0, top: 0, width: 0, height: 0 }, false);
    pick({ from, to });
  }

  // ---- the readout under the timeline ----------------------------------------------------

  function renderReadout() {
    const table = byId("readout"), pick = recorded();
    const range = pick.from !== undefined;
    table.dataset.t = range ? "" : pick.t;
    table.dataset.from = range ? pick.from : "";
    table.dataset.to = range ? pick.to : "";
    const body = header(table, range ? ["curve", `at ${seconds(pick.from)}`, `at ${seconds(pick.to)}`, "change"] : ["curve", `at ${seconds(pick.t)}`]);
    for (const c of curves) {
      const row = body.insertRow();
      row.dataset.pid = data.processes[c.process].pid;
      row.dataset.device = c.device === null ? "" : c.device;
      row.dataset.metric = c.metric;
      cell(row, curveLabel(c));
      if (range) {
        const a = valueAt(c, pick.from), b = valueAt(c, pick.to);
        row.dataset.bytes = b === null ? "" : b;
        cell(row, a === null ? "—" : human(a), "num", a === null ? "" : `${a} bytes`);
        cell(row, b === null ? "—" : human(b), "num", b === null ? "" : `${b} bytes`);
        cell(row, a === null || b === null ? "—" : human(b - a), "num");
      } else {
        const v = valueAt(c, pick.t);
        row.dataset.bytes = v === null ? "" : v;
        cell(row, v === null ? "—" : human(v), "num", v === null ? "" : `${v} bytes`);
      }
    }
  }

  // ---- the ranks of a distributed job, side by side -------------------------------------------

  // Each ranked process's allocator at the instant picked (the range's end) and at its peak,
  // summed over its devices, in rank order: the one that holds more than its peers stands out.
  function renderRanks() {
    const ranked = data.processes.map((p, i) => ({ p, i })).filter((r) => r.p.rank !== undefined);
    const table = byId("ranks");
    if (ranked.length < 2) return;
    byId("ranks-title").hidden = false;
    table.hidden = false;
    ranked.sort((a, b) => a.p.rank - b.p.rank || a.p.start - b.p.start);
    const pick = recorded(), t = pick.from !== undefined ? pick.to : pick.t;
    const body = header(table, ["rank", "process", "job", `allocated at ${seconds(t)}`, `reserved at ${seconds(t)}`, "peak allocated", "peak reserved"]);
    for (const { p, i } of ranked) {
      const mine = (metric) => data.curves.filter((c) => c.process === i && c.metric === metric);
      const at = (metric) => mine(metric).reduce((sum, c) => sum + (valueAt(c, t) || 0), 0);
      const peak = (metric) => mine(metric).reduce((sum, c) => sum + c.v.reduce((m, v) => Math.max(m, v), 0), 0);
      const row = body.insertRow();
      row.dataset.rank = p.rank;
      row.dataset.pid = p.pid;
      row.dataset.peakAllocated = peak("allocated");
      row.dataset.peakReserved = peak("reserved");
      cell(row, String(p.rank), "num");
      cell(row, `pid ${p.pid} ${p.comm}`);
      cell(row, p.job || "");
      for (const metric of ["allocated", "reserved"]) cell(row, human(at(metric)), "num", `${at(metric)} bytes`);
      for (const metric of ["allocated", "reserved"]) cell(row, human(peak(metric)), "num", `${peak(metric)} bytes`);
    }
  }

  // ---- the icicle graph --------------------------------------------------------------------

  const ROW = 18;
  let layout = [];

  function tree(rows) {
    const root = { key: "root", label: "", cls: "node", value: 0, count: 0, children: new Map(), frame: null };
    const one = state.process !== "all";
    for (const e of rows) {
      root.value += e.b;
      root.count += e.c;
      const steps = [];
      if (!one) steps.push({ key: `p${e.p}`, label: processLabel(e.p), cls: "node", frame: null });
      steps.push({ key: `k${e.k}`, label: kindLabel(e.k), cls: e.k === KIND_CACHE ? "cache" : "node", frame: null });
      const path = pathOf(e.n);
      if (!path.length && e.k !== KIND_CACHE) steps.push({ key: "none", label: "(no Python stack)", cls: "node", frame: null });
      for (const f of path) steps.push({ key: `f${f}`, label: frameName(f), cls: S.class[f], frame: f });
      let node = root;
      for (const step of steps) {
        let child = node.children.get(step.key);
        if (!child) {
          child = { ...step, value: 0, count: 0, children: new Map() };
          node.children.set(step.key, child);
        }
        child.value += e.b;
        child.count += e.c;
        node = child;
      }
    }
    return root;
  }

  const COLORS = { user: "#e8833a", library: "#8fa9c9", autograd: "#a98bd8", native: "#8fb996", node: "#5d6675", cache: "#c9ced6" };

  function renderIcicle(root, title) {
    const canvas = byId("icicle"), box = byId("icicle-box");
    root.label = title;
    // The zoomed node, if it still exists; its ancestors stay drawn full width above it.
    let focus = root;
    const chain = [root];
    for (const key of state.zoom) {
      const next = focus.children.get(key);
      if (!next) break;
      focus = next;
      chain.push(next);
    }
    const width = Math.max(400, box.clientWidth);
    layout = [];
    chain.forEach((node, depth) => layout.push({ node, x: 0, w: width, depth, path: state.zoom.slice(0, depth) }));
    const place = (node, x, w, depth, path) => {
      let at = x;
      const children = Array.from(node.children.values()).sort((a, b) => b.value - a.value);
      for (const child of children) {
        const cw = node.value ? (w * child.value) / node.value : 0;
        if (cw >= 0.5) {
          const childPath = path.concat([child.key]);
          layout.push({ node: child, x: at, w: cw, depth, path: childPath });
          place(child, at, cw, depth + 1, childPath);
        }
        at += cw;
      }
    };
    place(focus, 0, width, chain.length, state.zoom.slice(0, chain.length - 1));
    const depth = layout.reduce((d, r) => Math.max(d, r.depth), 0) + 1;
    const dpr = devicePixelRatio || 1;
    canvas.width = width * dpr;
    canvas.height = depth * ROW * dpr;
    canvas.style.width = `${width}px`;
    canvas.style.height = `${depth * ROW}px`;
    const ctx = canvas.getContext("2d");
    ctx.scale(dpr, dpr);
    ctx.font = "12px system-ui, sans-serif";
    ctx.textBaseline = "middle";
    for (const r of layout) {
      const y = r.depth * ROW;
      ctx.fillStyle = COLORS[r.node.cls] || COLORS.library;
      ctx.fillRect(r.x, y, Math.max(r.w - 1, 0.5), ROW - 1);
      if (r.w < 24) continue;
      const label = r.depth === 0 ? `${r.node.label}: ${human(root.value)}` : r.node.label;
      ctx.fillStyle = r.node.cls === "node" ? "#fff" : "#1d2330";
      ctx.save();
      ctx.beginPath();
      ctx.rect(r.x, y, r.w - 2, ROW);
      ctx.clip();
      ctx.fillText(label, r.x + 3, y + ROW / 2);
      ctx.restore();
    }
    canvas.dataset.total = root.value;
  }

  function rectAt(event) {
    const box = byId("icicle").getBoundingClientRect();
    const x = event.clientX - box.left, y = event.clientY - box.top;
    const depth = Math.floor(y / ROW);
    return layout.find((r) => r.depth === depth && x >= r.x && x < r.x + r.w);
  }

  function setupIcicle() {
    const canvas = byId("icicle"), tip = byId("icicle-tip");
    canvas.addEventListener("mousemove", (event) => {
      const r = rectAt(event);
      if (!r) { tip.hidden = true; return; }
      const total = layout[0].node.value || 1;
      const where = r.node.frame !== null ? `\n${frameWhere(r.node.frame)}` : "";
      tip.textContent = `${r.node.label}${where}\n${human(r.node.value)} (${r.node.value} bytes, ${((100 * r.node.value) / total).toFixed(1)}%) in ${r.node.count} blocks`;
      tip.style.left = `${event.clientX + 12}px`;
      tip.style.top = `${event.clientY + 12}px`;
      tip.hidden = false;
    });
    canvas.addEventListener("mouseleave", () => { tip.hidden = true; });
    canvas.addEventListener("click", (event) => {
      const r = rectAt(event);
      if (!r) return;
      state.zoom = r.depth === 0 ? [] : r.path;
      renderStacks();
    });
  }

  // ---- the stacks, blocks and findings -------------------------------------------------------

  function renderStacks() {
    const pick = recorded(), picked = state.pick, v = view();
    const snapshot = data.snapshots[pick.index];
    const title = byId("instant-title"), note = byId("instant-note");
    let heading;
    if (pick.from !== undefined) {
      heading = `What grew between ${seconds(pick.from)} and ${seconds(pick.to)}`;
      note.textContent = `Live bytes at ${seconds(pick.to)} less those at ${seconds(pick.from)}, by stack: the instants the report keeps nearest at or before the range's ends (you picked ${seconds(picked.from)} to ${seconds(picked.to)}). Blocks: the largest allocated within the range and still live at its end.`;
    } else {
      const named = snapshot.label ? ` (${snapshot.label})` : "";
      heading = `Live memory at ${seconds(pick.t)}${named}`;
      note.textContent = picked.t === undefined || picked.t === pick.t ? "As recorded at this instant."
        : `You picked ${seconds(picked.t)}: this is the nearest instant at or before it that the report keeps (${data.snapshots.length} in all: an even grid, the peak, each finding and the end), where the curves and the stacks are exact.`;
    }
    title.textContent = heading;
    title.dataset.snapshotT = snapshot.t;
    title.dataset.snapshotLabel = snapshot.label;
    title.dataset.fromSnapshotT = pick.from === undefined ? "" : pick.from;
    renderIcicle(tree(v.rows), pick.from !== undefined ? "grew" : state.process === "all" ? "all processes" : processLabel(state.process));

    const body = header(byId("top-stacks"), ["bytes", "blocks", "process", "kind", "your line", "innermost frames"]);
    for (const e of v.rows.slice().sort((a, b) => b.b - a.b || a.n - b.n).slice(0, 15)) {
      const row = body.insertRow();
      row.dataset.bytes = e.b;
      row.dataset.blocks = e.c;
      row.dataset.pid = data.processes[e.p].pid;
      row.dataset.kind = kindLabel(e.k);
      const cache = e.k === KIND_CACHE;
      row.dataset.userLine = cache ? "" : userLine(e.n);
      row.dataset.stack = pathOf(e.n).slice().reverse().map(frameName).join(" <- ");
      cell(row, human(e.b), "num", `${e.b} bytes`);
      cell(row, String(e.c), "num");
      cell(row, processLabel(e.p));
      cell(row, kindLabel(e.k));
      cell(row, cache ? "—" : userLine(e.n), "code");
      cell(row, cache ? "reserved from the driver, free for the next tensors" : pathOf(e.n).slice(-3).reverse().map(frameName).join(" ← ") || "(no Python stack)", "code", cache ? "" : stackText(e.n));
    }
    const blockBody = header(byId("top-blocks"), ["size", "address", "process", "kind", "allocated at", "your line"]);
    for (const b of v.blocks.slice(0, 20)) {
      const row = blockBody.insertRow();
      row.dataset.bytes = b.size;
      row.dataset.addr = b.addr;
      row.dataset.pid = data.processes[b.p].pid;
      cell(row, human(b.size), "num", `${b.size} bytes`);
      cell(row, b.addr, "code");
      cell(row, processLabel(b.p));
      cell(row, kindLabel(b.k));
      cell(row, seconds(b.since), "num");
      cell(row, userLine(b.n), "code", stackText(b.n));
    }
  }

  function findingSnapshot(i) {
    const label = `finding ${i + 1}`;
    const at = data.snapshots.findIndex((s) => s.label === label);
    return at >= 0 ? at : undefined;
  }

  function renderFindings() {
    const body = header(byId("findings"), ["time", "finding", "process", "bytes", "your line", "what to do"]);
    data.findings.forEach((f, i) => {
      if (f.process !== null && f.process !== undefined && !shown(f.process)) return;
      const row = body.insertRow();
      row.className = "clickable";
      row.dataset.kind = f.kind;
      row.dataset.pid = f.pid;
      row.dataset.bytes = f.bytes;
      row.dataset.t = f.t;
      const line = f.user_frame ? `${f.user_frame.file}:${f.user_frame.line}` : "";
      row.dataset.userLine = line;
      cell(row, seconds(f.t), "num");
      cell(row, `${f.kind} [${f.severity}]${f.diagnosis ? `: ${f.diagnosis}` : ""}`, `sev-${f.severity}`);
      const rank = f.rank === undefined ? "" : ` (rank ${f.rank})`;
      cell(row, `pid ${f.pid}${rank} ${f.comm}${f.peer_pid ? ` (peer ${f.peer_pid})` : ""}`);
      cell(row, human(f.bytes), "num", `${f.bytes} bytes in ${f.count}`);
      cell(row, f.user_frame ? `${basename(f.user_frame.file)}:${f.user_frame.line} in ${f.user_frame.function}` : "—", "code",
        (f.stack || []).map((fr) => `${fr.file}:${fr.line} in ${fr.function}`).join("\n"));
      cell(row, f.detail);
      row.addEventListener("click", () => pick({ t: f.t, snapshot: findingSnapshot(i) }));
    });
    if (!body.rows.length) cell(body.insertRow(), "No findings.");
  }

  // ---- what if: the allocator's requests under other settings ------------------------------------

  const gib = (bytes) => `${(bytes / 2 ** 30).toFixed(2)} GiB`;

  function renderWhatif() {
    const box = byId("whatif");
    box.textContent = "";
    const panel = data.whatif;
    if (!panel.processes.length) {
      const p = document.createElement("p");
      p.textContent = panel.note || "No allocator requests to replay.";
      box.appendChild(p);
      return;
    }
    for (const w of panel.processes) {
      const div = document.createElement("div");
      div.className = "whatif-process";
      div.dataset.pid = w.pid;
      const title = document.createElement("h3");
      title.textContent = `pid ${w.pid}, GPU ${w.device}: ${w.requests.toLocaleString("en")} requests, settings ${w.ran_with}`;
      div.appendChild(title);
      const note = document.createElement("p");
      note.className = "whatif-check";
      note.textContent = w.check === "exact"
        ? `Replay check: exact at every request and segment. The allocator may have ${w.budget === null ? "any amount" : gib(w.budget)}: ${w.budget_source}.`
        : `No prediction: ${w.check}`;
      div.appendChild(note);
      box.appendChild(div);
      if (w.check !== "exact") continue;
      const table = document.createElement("table");
      table.className = "whatif-runs";
      div.appendChild(table);
      const body = header(table, ["", "setting", "peak reserved", "cache at the peak", "out of memory", "your line"]);
      w.runs.forEach((run, i) => {
        const row = body.insertRow();
        cell(row, i === 0 ? "as it ran" : `${i}.`);
        cell(row, run.setting, "code");
        cell(row, gib(run.peak_reserved), "num", `${run.peak_reserved} bytes`);
        cell(row, gib(run.cache_at_peak), "num", `largest free block ${gib(run.largest_free_at_peak)}`);
        const oom = run.out_of_memory[0];
        if (oom) {
          const pinned = oom.every_segment_holds_a_live_block ? "; every segment holds a live block" : "";
          cell(row, `request ${oom.at.step} (${oom.at.seconds.toFixed(3)} s), asking for ${gib(oom.request)}${pinned}`, "oom",
            `${gib(oom.reserved)} reserved, ${gib(oom.reserved_unallocated)} of it free in pieces (largest ${gib(oom.largest_free_block)})`);
          cell(row, oom.at.where || "—", "code");
        } else {
          cell(row, "no");
          cell(row, "");
        }
      });
      const chartBox = document.createElement("div");
      chartBox.className = "whatif-chart";
      div.appendChild(chartBox);
      const xs = w.runs[0].curve.map((point) => point[0]);
      const columns = [xs, ...w.runs.map((run) => run.curve.map((point) => point[1]))];
      const series = [{ label: "seconds after the first request", value: (u, v) => (v == null ? "—" : `${v.toFixed(3)} s`) }];
      w.runs.forEach((run, i) => series.push({
        label: i === 0 ? `as it ran (${run.setting})` : run.setting,
        stroke: PALETTE[i % PALETTE.length],
        width: i === 0 ? 2.5 : 1.5,
        dash: i === 0 ? [] : [6, 3],
        points: { show: false },
        value: (u, v) => (v == null ? "—" : human(v)),
      }));
      new uPlot({
        width: Math.max(400, box.clientWidth),
        height: 240,
        scales: { x: { time: false } },
        axes: [
          { label: "seconds after the first request: reserved under each setting", values: (u, splits) => splits.map((v) => `${+v.toPrecision(3)}`) },
          { size: 80, values: (u, splits) => splits.map((v) => human(v)) },
        ],
        series,
      }, columns, chartBox);
    }
  }

  // ---- picking, the address bar, the whole page ----------------------------------------------

  function pick(p) {
    state.pick = p;
    state.zoom = [];
    const params = new URLSearchParams();
    if (p.from !== undefined) { params.set("from", (p.from / NS).toFixed(9)); params.set("to", (p.to / NS).toFixed(9)); }
    else params.set("t", (p.t / NS).toFixed(9));
    if (state.process !== "all") params.set("pid", data.processes[state.process].pid);
    else if (data.initial.pid !== null && data.initial.pid !== undefined) params.set("pid", "all");
    if (state.layer !== data.initial.layer) params.set("layer", state.layer);
    history.replaceState(null, "", `#${params}`);
    byId("zoom-in").disabled = p.from === undefined || !chart;
    renderReadout();
    renderRanks();
    renderStacks();
    if (chart) chart.redraw(false);
  }

  function setupControls() {
    const select = byId("process");
    select.add(new Option("all processes", "all"));
    data.processes.forEach((p, i) => { if (p.cuda) select.add(new Option(processLabel(i), String(i))); });
    select.addEventListener("change", () => {
      state.process = select.value === "all" ? "all" : Number(select.value);
      buildChart();
      renderFindings();
      pick(state.pick);
    });
    byId("zoom-in").addEventListener("click", () => {
      const p = state.pick;
      if (!chart || p.from === undefined || p.to <= p.from) return;
      chart.setScale("x", { min: p.from / NS, max: p.to / NS });
      byId("zoom-out").disabled = false;
    });
    byId("zoom-out").addEventListener("click", () => {
      if (chart) chart.setScale("x", { min: 0, max: data.span / NS });
      byId("zoom-out").disabled = true;
    });
    const layer = byId("layer");
    layer.value = state.layer;
    layer.addEventListener("change", () => { state.layer = layer.value; pick(state.pick); });
  }

  function overview() {
    const cuda = data.processes.filter((p) => p.cuda).length;
    const leaks = data.findings.filter((f) => f.severity === "leak").length;
    const peak = data.peak ? `; the most held together ${human(data.peak.bytes)} at ${seconds(data.peak.t)}` : "";
    const began = new Date(data.first_ts / 1e6).toISOString().replace("T", " ").slice(0, 19);
    byId("overview").textContent = `${data.input}: ${data.events.toLocaleString("en")} events over ${seconds(data.span)} from ${began} UTC, ` +
      `${cuda} process${cuda === 1 ? "" : "es"} using CUDA${peak}; ${data.findings.length} finding${data.findings.length === 1 ? "" : "s"} (${leaks} to act on).`;
    const notes = byId("notes");
    for (const note of data.notes) {
      const item = document.createElement("li");
      item.textContent = note;
      notes.appendChild(item);
    }
    notes.hidden = data.notes.length === 0;
    const warning = byId("warning");
    if (data.truncated) { warning.textContent = "The recording was cut short (its capture did not finish): this covers the events it holds."; warning.hidden = false; }
    else if (data.lost) { warning.textContent = `The capture lost ${data.lost.toLocaleString("en")} events: the curves and stacks lack them.`; warning.hidden = false; }
  }

  // What the address says; what it leaves out is what the page opened with.
  function fromAddress() {
    const params = new URLSearchParams(location.hash.slice(1));
    const given = params.get("pid");
    const pid = given === "all" ? null : given !== null ? Number(given) : data.initial.pid;
    state.process = "all";
    if (pid !== null && pid !== undefined) {
      const index = data.processes.findIndex((p) => p.pid === pid && p.cuda);
      if (index >= 0) state.process = index;
    }
    const layer = params.get("layer");
    state.layer = ["auto", "tensors", "driver"].includes(layer) ? layer : data.initial.layer;
    const secondsOf = (name) => clamp(Math.round(Number(params.get(name)) * NS));
    if (params.get("from") !== null && params.get("to") !== null) return { from: secondsOf("from"), to: secondsOf("to") };
    if (params.get("t") !== null) return { t: secondsOf("t") };
    const t = data.initial.t;
    const peak = data.snapshots.findIndex((s) => s.label === "peak");
    return data.peak && t === data.peak.t && peak >= 0 ? { t, snapshot: peak } : { t };
  }

  const first = fromAddress();
  overview();
  setupControls();
  byId("process").value = String(state.process);
  byId("layer").value = state.layer;
  setupIcicle();
  buildChart();
  renderFindings();
  renderWhatif();
  pick(first);
  window.addEventListener("hashchange", () => {
    const p = fromAddress();
    byId("process").value = String(state.process);
    byId("layer").value = state.layer;
    buildChart();
    renderFindings();
    pick(p);
  });
  let resizing = null;
  window.addEventListener("resize", () => {
    clearTimeout(resizing);
    resizing = setTimeout(() => {
      if (chart) chart.setSize({ width: Math.max(400, byId("timeline").clientWidth), height: 320 });
      renderStacks();
    }, 100);
  });

  // For scripts that drive the page (gpuprof's tests): where an instant lies on screen.
  window.gpuprofReport = {
    data,
    readyMs: performance.now() - started,
    loadedMs: performance.now(),
    pick: (t) => pick({ t: clamp(Math.round(t * NS)) }),
    pickRange: (from, to) => pick({ from: clamp(Math.round(from * NS)), to: clamp(Math.round(to * NS)) }),
    screenPoint: (t) => {
      const box = chart.over.getBoundingClientRect();
      return { x: box.left + chart.valToPos(t, "x"), y: box.top + box.height / 2 };
    },
  };
  document.body.dataset.ready = "true";
})();
