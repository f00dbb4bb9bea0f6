// headscope view: type text, see any head's attention beside its measured evidence.
// Every piece of data is written with textContent or setAttribute, never as markup.
// The JSON it reads is declared in headscope/view/card_schema.py. Each value of a declared record is held under
// one of these names, and under no other, so that tests/test_view_schema.py can check every field read here:
// schema: INFO PageInfo
// schema: H HeadsTable
// schema: src Source
// schema: stat Statistic
// schema: imp Measure
// schema: rd RoleDetail
// schema: kv KvChoice
// schema: path PathEntry
// schema: edges EdgeLists
// schema: edge Edge
"use strict";
(function () {
  const DATA = JSON.parse(document.getElementById("hs-view-data").textContent);
  const INFO = DATA.info;
  const STATIC = DATA.static; // null when served live: the script asks the server's JSON API
  const ARC_MAX = 96; // tokens up to which the arcs are drawn (the heat map draws any length)
  const WINDOW = 128; // tokens a side of the heat map; a longer text is drawn as a window that moves
  const COLOURS = ["#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#eeca3b", "#b279a2", "#ff9da6",
    "#9d755d", "#bab0ac", "#1b9e77", "#d95f02"];
  // The report's heat-map ramp (white -> dark blue), over sqrt(weight): weak but real attention stays visible.
  const BLUES = [[255, 255, 255], [198, 219, 239], [107, 174, 214], [33, 113, 181], [8, 48, 107]];
  // The first head drawn: head 0 of the first layer that has heads (a hybrid model's layer 0 may have none).
  const FIRST = [Math.max(0, INFO.heads_in_layer.findIndex((n) => n > 0)), 0];
  const state = { heads: null, text: "", tokens: null, ids: null, promptLen: null, gen: null, maps: null,
    slots: [FIRST, null], seq: 0, weighting: "attention", focus: [null, null] };
  const $ = (id) => document.getElementById(id);

  function el(tag, attrs, text) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "class") e.className = v; else e.setAttribute(k, String(v));
    }
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }
  function svg(tag, attrs) {
    const e = document.createElementNS("http://www.w3.org/2000/svg", tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
    return e;
  }
  const label = (t) => String(t).replace(/\u0120/g, "\u00b7").replace(/\u2581/g, "\u00b7").replace(/\u010a/g, "\\n");
  const headName = (l, h) => "L" + l + "H" + h;
  const num = (v, d) => (v === null || v === undefined || Number.isNaN(Number(v))) ? "n/a" : Number(v).toFixed(d === undefined ? 3 : d);
  const interval = (v, lo, hi, d) => num(v, d) + (lo !== undefined && lo !== null ? " [" + num(lo, d) + ", " + num(hi, d) + "]" : "");
  const isGen = (i) => state.promptLen !== null && i >= state.promptLen;
  const tokenText = (i) => label(state.tokens[i]) + (isGen(i) ? " (generated)" : "");
  function ramp(t) {
    t = Math.max(0, Math.min(1, t));
    const x = t * (BLUES.length - 1), i = Math.min(Math.floor(x), BLUES.length - 2), f = x - i;
    return [0, 1, 2].map((k) => Math.round(BLUES[i][k] + (BLUES[i + 1][k] - BLUES[i][k]) * f));
  }
  const shade = (v, top) => ramp(Math.sqrt(Math.max(0, v) / (top > 0 ? top : 1)));
  function status(msg, isError) { const s = $("status"); s.textContent = msg; s.className = isError ? "error" : ""; }
  function showNotes(body) { // any note the server adds to an answer (a text cut to the model's positions, ...)
    const box = $("notes"), found = [];
    for (const k of ["note", "notes", "truncation", "truncated"]) {
      const v = body ? body[k] : null;
      if (typeof v === "string" && v) found.push(v);
      else if (Array.isArray(v)) for (const x of v) if (typeof x === "string" && x) found.push(x);
      else if (v && typeof v === "object" && typeof v.message === "string") found.push(v.message);
    }
    box.textContent = found.join(" ");
  }

  class ApiError extends Error { constructor(status, msg) { super(msg); this.status = status; } }

  async function api(route, params) {
    if (STATIC) return staticApi(route, params);
    const q = new URLSearchParams(params || {}).toString();
    const r = await fetch(route + (q ? "?" + q : ""), { headers: { Accept: "application/json" } });
    let body = null;
    try { body = await r.json(); } catch (e) { body = { error: "HTTP " + r.status }; }
    if (!r.ok) throw new ApiError(r.status, body.error || ("HTTP " + r.status));
    return body;
  }
  function staticWindow(w, params) { // what the server's window=Q0,K0,SIZE answers, cut from an embedded map
    const T = w.length, [q, k, n] = params.window.split(",").map(Number), size = Math.min(n, T);
    const q0 = Math.max(0, Math.min(q, T - size)), k0 = Math.max(0, Math.min(k, T - size));
    const cells = Math.min(T, 256), cuts = [];
    for (let i = 0; i <= cells; i++) cuts.push(Math.floor(i * T / cells));
    const overview = [];
    for (let a = 0; a < cells; a++) {
      const row = [];
      for (let b = 0; b < cells; b++) {
        let m = 0;
        for (let i = cuts[a]; i < cuts[a + 1]; i++) for (let j = cuts[b]; j < cuts[b + 1]; j++) m = Math.max(m, w[i][j]);
        row.push(m);
      }
      overview.push(row);
    }
    return { tokens: STATIC.tokens, weights: w.slice(q0, q0 + size).map((r) => r.slice(k0, k0 + size)),
      window: { q0: q0, k0: k0, size: size }, max: Math.max(...w.map((r) => Math.max(...r))), overview: overview };
  }
  function staticApi(route, params) {
    if (route === "/api/heads") return STATIC.heads;
    if (route === "/api/maps") {
      if (!STATIC.maps) throw new ApiError(413, "every head's map is not in this saved view (a long text): it holds the chosen heads only");
      return { tokens: STATIC.tokens, maps: STATIC.maps, note: STATIC.note };
    }
    const key = headName(params.layer, params.head);
    let w = null;
    if (STATIC.maps) w = STATIC.maps[params.layer][params.head];
    else if (STATIC.attention[key]) w = STATIC.attention[key];
    else throw new ApiError(400, absentMessage(params.layer, params.head));
    return params.window ? Object.assign(staticWindow(w, params), { note: STATIC.note }) : { tokens: STATIC.tokens, note: STATIC.note, weights: w };
  }
  const held = (l, h) => !STATIC || STATIC.maps !== null || headName(l, h) in STATIC.attention;
  function absentMessage(l, h) {
    return headName(l, h) + " is not in this saved view of a long text; it holds " + Object.keys(STATIC.attention).join(", ") +
      " (pass heads=(\"" + headName(l, h) + "\",) to headscope.view for another head)";
  }

  // ---- the page's address: the text, the heads and the weighting, to share a view -----------------------
  const HEAD_RE = /^L(\d{1,4})H(\d{1,4})$/;
  function parseHead(v, what, notes) {
    const m = HEAD_RE.exec(v || "");
    if (!m) { notes.push(what + "=" + String(v).slice(0, 40) + " is not a head such as L2H5; ignored"); return null; }
    const l = Number(m[1]), h = Number(m[2]);
    if (l >= INFO.n_layers || h >= (INFO.heads_in_layer[l] || 0)) { notes.push(what + "=" + v + " is not a head of this model; ignored"); return null; }
    return [l, h];
  }
  function readAddress() { // what the address asks for; anything malformed is ignored with a note
    const p = new URLSearchParams(window.location.search), notes = [], out = { notes: notes };
    if (p.has("head")) out.head = parseHead(p.get("head"), "head", notes);
    if (p.has("head2")) out.head2 = parseHead(p.get("head2"), "head2", notes);
    if (p.has("weighting")) {
      if ((INFO.weightings || ["attention"]).includes(p.get("weighting"))) out.weighting = p.get("weighting");
      else notes.push("weighting=" + String(p.get("weighting")).slice(0, 40) + " is not attention or norm; ignored");
    }
    if (p.has("gen")) {
      const n = Number(p.get("gen"));
      if (INFO.generates && Number.isInteger(n) && n >= 1 && n <= INFO.max_new_tokens) out.gen = n;
      else notes.push("gen=" + String(p.get("gen")).slice(0, 40) + (INFO.generates ? " is not a number of tokens from 1 to " + INFO.max_new_tokens : ": this model does not generate") + "; ignored");
    }
    if (p.has("text")) {
      const t = p.get("text");
      if (t.trim() && t.length <= INFO.max_chars) out.text = t;
      else notes.push("text is " + (t.trim() ? "longer than " + INFO.max_chars + " characters" : "empty") + "; ignored");
    }
    return out;
  }
  function writeAddress() {
    if (STATIC) return;
    const p = new URLSearchParams(), typed = $("text").value;
    if (typed.trim()) p.set("text", typed);
    if (state.slots[0]) p.set("head", headName(...state.slots[0]));
    if (state.slots[1]) p.set("head2", headName(...state.slots[1]));
    if (state.weighting !== "attention") p.set("weighting", state.weighting);
    if (state.gen) p.set("gen", String(state.gen));
    const q = p.toString();
    try { history.replaceState(null, "", window.location.pathname + (q ? "?" + q : "")); } catch (e) { /* no address to keep */ }
  }

  // ---- the grid ------------------------------------------------------------------------------------
  function patchingName() { // the exact effect, or attribution's estimate where the run had no exact scan
    const H = state.heads || {};
    return H.patching && H.patching.measure === "attribution" ? "patching (attribution estimate)" : "patching effect";
  }
  function roleList(s) { return String(s || "").split(";").map((r) => r.trim()).filter(Boolean); }
  function colourings() {
    const H = state.heads || {}, out = [];
    if (H.roles) out.push(["roles", "roles"]);
    for (const m of Object.keys(H.importance || {})) out.push(["importance:" + m, "importance rank: " + m]);
    if (H.patching) out.push(["patching", patchingName()]);
    for (const c of Object.keys(H.statistics || {})) out.push(["stat:" + c, c]);
    out.push(["none", "nothing"]);
    return out;
  }
  function seq(v, lo, hi) { // light yellow -> dark blue
    const t = hi > lo ? Math.min(1, Math.max(0, (v - lo) / (hi - lo))) : 0.5;
    return "rgb(" + Math.round(250 - 210 * t) + "," + Math.round(245 - 160 * t) + "," + Math.round(200 - 50 * t) + ")";
  }
  function diverging(v, m) { // blue (negative) - white - red (positive)
    const t = m > 0 ? Math.max(-1, Math.min(1, v / m)) : 0;
    const a = Math.round(255 - 200 * Math.abs(t));
    return t >= 0 ? "rgb(255," + a + "," + a + ")" : "rgb(" + a + "," + a + ",255)";
  }
  function stripes(colours) { // one stripe per role, left to right in the head's order of roles
    if (colours.length === 1) return colours[0];
    const w = 100 / colours.length;
    return "linear-gradient(to right, " + colours.map((c, i) => c + " " + (i * w).toFixed(1) + "% " + ((i + 1) * w).toFixed(1) + "%").join(", ") + ")";
  }
  function cellColours(by) {
    const H = state.heads || {}, n = INFO.n_layers * INFO.n_heads, out = new Array(n).fill("rgb(225, 225, 225)");
    const legend = [];
    if (by === "roles" && H.roles) {
      const fams = {};
      let unsure = 0, several = 0;
      H.roles.forEach((r, i) => {
        const roles = roleList(r);
        if (roles.length) {
          const cs = [];
          for (const role of roles) {
            const f = role.split(":")[0];
            if (!(f in fams)) fams[f] = COLOURS[Object.keys(fams).length % COLOURS.length];
            if (!cs.includes(fams[f])) cs.push(fams[f]);
          }
          out[i] = stripes(cs);
          if (cs.length > 1) several++;
        } else if (H.uncertain && roleList(H.uncertain[i]).length) { out[i] = "rgb(150, 150, 150)"; unsure++; }
      });
      for (const [f, c] of Object.entries(fams)) legend.push([c, f]);
      if (several) legend.push([stripes(Object.values(fams).slice(0, 3)), "several roles: one stripe each (" + several + " heads)"]);
      if (unsure) legend.push(["rgb(150, 150, 150)", "uncertain (" + unsure + ")"]);
      legend.push(["rgb(225, 225, 225)", "no role"]);
    } else if (by.startsWith("importance:")) {
      const imp = H.importance[by.slice(11)];
      const valid = imp.rank.filter((r) => r !== null).length;
      imp.rank.forEach((r, i) => { if (r !== null) out[i] = seq(valid - r, 0, valid - 1); });
      legend.push([seq(valid - 1, 0, valid - 1), "rank 1 (most important)"], [seq(0, 0, valid - 1), "rank " + valid]);
    } else if (by === "patching") {
      const v = H.patching.values, m = Math.max(...v.filter((x) => x !== null).map(Math.abs), 0);
      v.forEach((x, i) => { if (x !== null) out[i] = diverging(x, m); });
      legend.push([diverging(m, m), "effect " + num(m, 2)], [diverging(-m, m), "effect " + num(-m, 2)]);
    } else if (by.startsWith("stat:")) {
      const stat = H.statistics[by.slice(5)], v = stat.values, ok = v.filter((x) => x !== null);
      const lo = Math.min(...ok), hi = Math.max(...ok);
      v.forEach((x, i) => { if (x !== null) out[i] = seq(x, lo, hi); });
      legend.push([seq(lo, lo, hi), num(lo)], [seq(hi, lo, hi), num(hi)]);
    }
    return [out, legend];
  }
  function drawGrid() {
    const grid = $("grid");
    grid.textContent = "";
    grid.style.gridTemplateColumns = "28px repeat(" + INFO.n_heads + ", 28px)";
    grid.appendChild(el("div", { class: "axis" }, ""));
    for (let h = 0; h < INFO.n_heads; h++) grid.appendChild(el("div", { class: "axis" }, "H" + h));
    const by = $("colour-by").value || "none";
    const [colours, legend] = cellColours(by);
    for (let l = 0; l < INFO.n_layers; l++) {
      grid.appendChild(el("div", { class: "axis" }, "L" + l));
      for (let h = 0; h < INFO.n_heads; h++) {
        const present = h < INFO.heads_in_layer[l];
        const c = el("div", { class: "cell" + (present ? "" : " empty") + (present && !held(l, h) ? " absent" : ""),
          "data-name": headName(l, h), "data-layer": l, "data-head": h });
        if (present) {
          c.style.background = colours[l * INFO.n_heads + h];
          c.title = tooltip(l, h);
          c.addEventListener("click", (ev) => select(ev.shiftKey ? 1 : 0, l, h));
        }
        state.slots.forEach((s, i) => { if (s && s[0] === l && s[1] === h) c.classList.add("sel" + i); });
        grid.appendChild(c);
      }
    }
    const lg = $("legend");
    lg.textContent = "";
    for (const [c, t] of legend) { const s = el("span"); const i = el("i"); i.style.background = c; s.appendChild(i); s.appendChild(document.createTextNode(t)); lg.appendChild(s); }
  }
  function tooltip(l, h) {
    const H = state.heads || {}, i = l * INFO.n_heads + h, lines = [headName(l, h)];
    if (H.roles) lines.push("roles: " + (roleList(H.roles[i]).join(", ") || "none"));
    if (H.uncertain && roleList(H.uncertain[i]).length) lines.push("uncertain roles: " + roleList(H.uncertain[i]).join(", "));
    for (const [m, imp] of Object.entries(H.importance || {})) lines.push(m + " rank " + (imp.rank[i] === null ? "n/a" : imp.rank[i]));
    if (H.patching) lines.push(patchingName() + " " + interval(H.patching.values[i], (H.patching.lo || [])[i], (H.patching.hi || [])[i]));
    if (!held(l, h)) lines.push("not in this saved view");
    return lines.join("\n");
  }

  // ---- one head: arcs, heat map, card ------------------------------------------------------------------
  async function select(slot, l, h) {
    if (!held(l, h)) { status(absentMessage(l, h), true); return; } // the shown head stays as it was
    state.slots[slot] = [l, h];
    state.focus[slot] = null;
    drawGrid();
    writeAddress();
    await drawSlot(slot);
  }
  function source() { return state.ids ? { ids: state.ids.join(",") } : { text: state.text }; }
  function weighted(params) { if (state.weighting !== "attention") params.weighting = state.weighting; return params; }
  // One head's weights as drawn: the whole map (texts up to WINDOW tokens) or a window of it with the whole
  // map's overview. {w, q0, k0, size, T, top, overview}
  async function weightsFor(l, h, focus) {
    const T = state.tokens.length;
    if (state.maps) {
      const w = state.maps[l][h];
      return { w: w, q0: 0, k0: 0, size: T, T: T, top: topOf(w), overview: null };
    }
    const f = focus || [T, T]; // default: the end of the text, the newest tokens
    const q0 = Math.max(0, f[0] - WINDOW / 2), k0 = Math.max(0, f[1] - WINDOW / 2);
    const r = await api("/api/attention", weighted(Object.assign(source(), { layer: l, head: h, window: q0 + "," + k0 + "," + WINDOW })));
    showNotes(r);
    return { w: r.weights, q0: r.window.q0, k0: r.window.k0, size: r.window.size, T: T, top: state.weighting === "attention" ? 1 : r.max,
      overview: r.window.size < T ? r.overview : null };
  }
  const topOf = (w) => state.weighting === "attention" ? 1 : Math.max(...w.map((r) => Math.max(...r)));
  async function drawSlot(slot) {
    const box = $("view-" + slot), s = state.slots[slot];
    if (!s || !state.tokens) { box.textContent = ""; return; }
    const [l, h] = s, mine = state.seq;
    let v;
    try { v = await weightsFor(l, h, state.focus[slot]); } catch (e) { status(e.message, true); return; }
    if (mine !== state.seq) return; // a newer text was run meanwhile
    box.textContent = "";
    const head = el("div", { class: "panel", "data-head": headName(l, h) });
    const bar = el("div", { class: "panel-bar" });
    bar.appendChild(el("h3", {}, headName(l, h) + (slot === 1 ? " (right)" : "") + (state.weighting === "norm" ? ": norm-based weights" : "")));
    const png = el("button", { type: "button", class: "small png", title: "download this head as a PNG picture" }, "PNG");
    bar.appendChild(png);
    if (slot === 1) { const b = el("button", { type: "button", class: "small" }, "close"); b.addEventListener("click", () => { state.slots[1] = null; drawGrid(); drawSlot(1); writeAddress(); }); bar.appendChild(b); }
    head.appendChild(bar);
    const caption = el("div", { class: "caption" }, "hover a token or a cell");
    const T = state.tokens.length;
    if (v.size === T && T <= ARC_MAX) head.appendChild(arcs(v.w, l, h, caption, v.top));
    else head.appendChild(el("p", { class: "hint" }, "arcs are drawn up to " + ARC_MAX + " tokens; the heat map shows all " + T));
    const heat = heatmap(v, l, h, caption);
    if (v.overview) head.appendChild(windowControls(v, slot, caption));
    const maps = el("div", { class: "maps" });
    maps.appendChild(heat);
    if (v.overview) maps.appendChild(overviewCanvas(v, slot));
    head.appendChild(maps);
    const key = scaleLegend(v.top);
    head.appendChild(key);
    head.appendChild(caption);
    png.addEventListener("click", () => exportPng(l, h, heat, key));
    box.appendChild(head);
    box.appendChild(card(l, h));
  }
  function top(row, k) {
    return row.map((v, j) => [v, j]).sort((a, b) => b[0] - a[0]).slice(0, k)
      .map(([v, j]) => label(state.tokens[j]) + " " + num(v, 3)).join(", ");
  }
  function arcs(w, l, h, caption, topW) {
    const T = state.tokens.length, rowH = 18, LABEL = 18; // longer labels are cut, the full token in its tooltip
    const shown = state.tokens.map((t) => { const s = label(t); return s.length > LABEL ? s.slice(0, LABEL - 1) + "\u2026" : s; });
    const wide = 7.3 * Math.max(...shown.map((s) => s.length)) + 8, xl = wide, xr = wide + 80, width = xr + wide;
    const g = svg("svg", { width: width, height: T * rowH + 8, "data-head": headName(l, h), class: "arcs" });
    const lines = [];
    for (let i = 0; i < T; i++) {
      for (let j = 0; j < T; j++) {
        const v = w[i][j] / topW;
        if (v < 0.01) continue;
        const ln = svg("line", { x1: xl + 4, y1: i * rowH + 12, x2: xr - 4, y2: j * rowH + 12, stroke: "#e8590c",
          "stroke-width": 2, "stroke-opacity": Math.min(1, v).toFixed(3), "data-q": i, "data-k": j });
        lines.push(ln);
        g.appendChild(ln);
      }
    }
    const show = (fn) => { for (const ln of lines) ln.style.display = fn(+ln.dataset.q, +ln.dataset.k) ? "" : "none"; };
    for (const [side, x, anchor] of [["q", xl, "end"], ["k", xr, "start"]]) {
      for (let i = 0; i < T; i++) {
        const t = svg("text", { x: x, y: i * rowH + 16, "text-anchor": anchor, "data-side": side, "data-i": i,
          "data-token": state.tokens[i] });
        if (isGen(i)) t.classList.add("gen");
        t.textContent = shown[i];
        const tip = svg("title");
        tip.textContent = label(state.tokens[i]) + " (token " + i + (isGen(i) ? ", generated" : "") + ")";
        t.appendChild(tip);
        t.addEventListener("mouseenter", () => {
          t.classList.add("on");
          if (side === "q") { show((q) => q === i); caption.textContent = "query " + i + " " + tokenText(i) + " attends to: " + top(w[i], 5); }
          else { show((q, k) => k === i); caption.textContent = "key " + i + " " + tokenText(i) + " is attended by: " + top(w.map((r) => r[i]), 5); }
        });
        t.addEventListener("mouseleave", () => { t.classList.remove("on"); show(() => true); });
        g.appendChild(t);
      }
    }
    return g;
  }
  function paint(canvas, w, rows, cols, cell, topW) {
    const ctx = canvas.getContext("2d"), img = ctx.createImageData(cols * cell, rows * cell);
    for (let i = 0; i < rows; i++) for (let j = 0; j < cols; j++) {
      const rgb = shade(w[i][j], topW);
      for (let y = i * cell; y < (i + 1) * cell; y++) for (let x = j * cell; x < (j + 1) * cell; x++) {
        const p = (y * cols * cell + x) * 4;
        img.data[p] = rgb[0]; img.data[p + 1] = rgb[1]; img.data[p + 2] = rgb[2]; img.data[p + 3] = 255;
      }
    }
    ctx.putImageData(img, 0, 0);
    return ctx;
  }
  function heatmap(v, l, h, caption) {
    const n = v.size, cell = Math.max(1, Math.min(18, Math.floor(420 / n)));
    const c = el("canvas", { width: n * cell, height: n * cell, "data-head": headName(l, h), "data-cell": cell,
      "data-left": v.k0, "data-top": v.q0, "data-size": n, class: "heat" });
    const ctx = paint(c, v.w, n, n, cell, v.top);
    if (state.promptLen !== null) { // where the continuation starts: a green line on rows and columns
      ctx.strokeStyle = "#2b8a3e"; ctx.lineWidth = 1; ctx.setLineDash([3, 2]);
      const y = (state.promptLen - v.q0) * cell, x = (state.promptLen - v.k0) * cell;
      ctx.beginPath();
      if (y > 0 && y < n * cell) { ctx.moveTo(0, y); ctx.lineTo(n * cell, y); }
      if (x > 0 && x < n * cell) { ctx.moveTo(x, 0); ctx.lineTo(x, n * cell); }
      ctx.stroke();
    }
    if (state.found && n < state.tokens.length) { // the token the search box found: an orange mark on its row
      const y = (state.found[1] - v.q0) * cell;
      if (y >= 0 && y < n * cell) { ctx.setLineDash([]); ctx.fillStyle = "#e8590c"; ctx.fillRect(0, y, 4, Math.max(cell, 2)); ctx.fillRect(n * cell - 4, y, 4, Math.max(cell, 2)); }
    }
    c.addEventListener("mousemove", (ev) => {
      const r = c.getBoundingClientRect();
      const j = Math.floor((ev.clientX - r.left) / cell), i = Math.floor((ev.clientY - r.top) / cell);
      if (i < 0 || j < 0 || i >= n || j >= n) return;
      caption.textContent = "query " + (v.q0 + i) + " " + tokenText(v.q0 + i) + " \u2192 key " + (v.k0 + j) + " " + tokenText(v.k0 + j) + ": " + num(v.w[i][j], 4);
    });
    return c;
  }
  function overviewCanvas(v, slot) { // the whole map, max-pooled; the window drawn on it; a click moves there
    const n = v.overview.length, scale = v.T / n;
    const c = el("canvas", { width: n, height: n, class: "overview", title: "the whole map (each pixel: the largest weight of its block); click to move the window" });
    const ctx = paint(c, v.overview, n, n, 1, v.top);
    ctx.strokeStyle = "#e8590c"; ctx.lineWidth = 2;
    ctx.strokeRect(v.k0 / scale, v.q0 / scale, v.size / scale, v.size / scale);
    c.addEventListener("click", (ev) => {
      const r = c.getBoundingClientRect();
      const k = Math.floor((ev.clientX - r.left) / r.width * v.T), q = Math.floor((ev.clientY - r.top) / r.height * v.T);
      moveTo(slot, [q, k]);
    });
    return c;
  }
  function moveTo(slot, focus) { state.focus[slot] = focus; drawSlot(slot); }
  function windowControls(v, slot, caption) {
    const box = el("div", { class: "window-controls" });
    const centre = Math.round(v.q0 + v.size / 2);
    box.appendChild(el("span", { class: "hint" }, "tokens " + v.q0 + "\u2013" + (v.q0 + v.size - 1) + " (queries), " + v.k0 + "\u2013" + (v.k0 + v.size - 1) + " (keys) of " + v.T + ":"));
    const slider = el("input", { type: "range", min: 0, max: v.T - 1, value: centre, class: "position", "aria-label": "position of the window" });
    slider.addEventListener("change", () => moveTo(slot, [Number(slider.value), Number(slider.value)]));
    box.appendChild(slider);
    const find = el("input", { type: "search", class: "find", placeholder: "find a token", "aria-label": "find a token" });
    find.addEventListener("keydown", (ev) => {
      if (ev.key !== "Enter") return;
      const want = find.value.trim().toLowerCase();
      if (!want) return;
      const hits = findTokens(want);
      if (!hits.length) { caption.textContent = "no token contains " + JSON.stringify(find.value.trim()); return; }
      const after = hits.find((i) => i > centre) ?? hits[0];
      state.found = [want, after];
      moveTo(slot, [after, after]);
    });
    box.appendChild(find);
    if (state.found) {
      const [want, at] = state.found;
      if (at >= v.q0 && at < v.q0 + v.size) box.appendChild(el("span", { class: "found" }, "found " + JSON.stringify(want) + " at token " + at + " (row " + (at - v.q0 + 1) + " of the window)"));
    }
    return box;
  }
  // The tokens where `want` starts, searched in the text the tokens spell (a word split into pieces is found).
  function findTokens(want) {
    const starts = [];
    let joined = "";
    for (const t of state.tokens) {
      starts.push(joined.length);
      joined += label(t).replace(/^##/, "").replace(/\u00b7/g, " ").toLowerCase();
    }
    const hits = [];
    for (let at = joined.indexOf(want); at >= 0; at = joined.indexOf(want, at + 1)) {
      let i = starts.length - 1;
      while (starts[i] > at) i--;
      if (hits[hits.length - 1] !== i) hits.push(i);
    }
    return hits;
  }
  function scaleLegend(topW) { // the colour key: sqrt scale, ticks at round weights
    const c = el("canvas", { width: 260, height: 30, class: "scale" });
    const ctx = c.getContext("2d");
    for (let x = 0; x < 240; x++) { ctx.fillStyle = "rgb(" + ramp(x / 239).join(",") + ")"; ctx.fillRect(10 + x, 2, 1, 10); }
    ctx.strokeStyle = "#999"; ctx.strokeRect(9.5, 1.5, 241, 11);
    ctx.fillStyle = "#333"; ctx.font = "9px sans-serif"; ctx.textAlign = "center";
    for (const t of [0, 0.01, 0.1, 0.25, 0.5, 1]) {
      const x = 10 + 239 * Math.sqrt(t);
      ctx.fillRect(x, 12, 1, 4);
      ctx.fillText(state.weighting === "attention" ? String(t) : num(t * topW, 2), x, 26);
    }
    const box = el("div", { class: "legend-scale" });
    box.appendChild(c);
    box.appendChild(el("span", { class: "hint" }, state.weighting === "attention"
      ? "colour = \u221aweight (as in the report), so weak attention stays visible"
      : "colour = \u221a(weight / " + num(topW, 2) + ", this head's largest ||\u03b1 f(x)||)"));
    return box;
  }
  function exportPng(l, h, heat, key) { // the shown head as a picture, with the model, head and text in it
    const scale = Math.max(1, Math.floor(480 / heat.width)), W = Math.max(560, heat.width * scale + 40);
    const text = (state.text + (state.promptLen !== null ? " [+ " + (state.tokens.length - state.promptLen) + " generated tokens]" : "")).replace(/\s+/g, " ");
    const lines = [];
    for (let i = 0; i < text.length && lines.length < 4; i += 90) lines.push(text.slice(i, i + 90) + (i + 90 < text.length && lines.length === 3 ? "\u2026" : ""));
    const head = 64 + 16 * lines.length, out = el("canvas", { width: W, height: head + heat.height * scale + 60 });
    const ctx = out.getContext("2d");
    ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, out.width, out.height);
    ctx.fillStyle = "#111"; ctx.font = "bold 15px sans-serif";
    ctx.fillText(INFO.name + " \u00b7 " + headName(l, h), 20, 24);
    ctx.font = "12px sans-serif";
    ctx.fillText((state.weighting === "norm" ? "norm-based weights ||\u03b1 f(x)||" : "attention probabilities") + ", rows = queries, " + state.tokens.length + " tokens" +
      (heat.dataset.size < state.tokens.length ? "; window from query " + heat.dataset.top + ", key " + heat.dataset.left : ""), 20, 44);
    ctx.font = "12px monospace";
    lines.forEach((s, i) => ctx.fillText(s, 20, 64 + 16 * i));
    ctx.imageSmoothingEnabled = false;
    ctx.drawImage(heat, 20, head, heat.width * scale, heat.height * scale);
    ctx.drawImage(key.querySelector("canvas"), 20, head + heat.height * scale + 12);
    ctx.font = "11px sans-serif"; ctx.fillStyle = "#555";
    ctx.fillText("headscope view; colour = \u221aweight", 290, head + heat.height * scale + 26);
    const name = "headscope-" + String(INFO.name).replace(/[^A-Za-z0-9_.-]+/g, "_") + "-" + headName(l, h) + ".png";
    out.toBlob((blob) => {
      const a = el("a", { href: URL.createObjectURL(blob), download: name });
      document.body.appendChild(a);
      a.click();
      a.remove();
      document.body.dataset.exported = name;
    }, "image/png");
  }
  function source_(dl, what, runHint) {
    const H = state.heads || {}, src = (H.sources || {})[what];
    const dd = el("dd");
    if (src && src.command) { dd.appendChild(document.createTextNode("from " + src.file + ", made by:")); dd.appendChild(el("code", {}, src.command)); }
    else if (src) dd.appendChild(el("span", { class: "none" }, "from " + src.file + " (no provenance recorded)"));
    else dd.appendChild(el("span", { class: "none" }, "not measured: run " + runHint + " and start the view with --from DIR"));
    dl.appendChild(dd);
  }
  function card(l, h) {
    const H = state.heads || {}, i = l * INFO.n_heads + h, name = headName(l, h);
    const box = el("div", { class: "panel card" });
    box.appendChild(el("h3", {}, name + ": the evidence"));
    const dl = el("dl");
    dl.appendChild(el("dt", {}, "Roles"));
    if (H.roles) {
      const heldRoles = roleList(H.roles[i]), unsure = H.uncertain ? roleList(H.uncertain[i]) : [];
      const detail = Object.fromEntries(((H.role_detail || {})[name] || []).map((rd) => [rd.role, rd]));
      if (!heldRoles.length) dl.appendChild(el("dd", {}, "no role above its baseline"));
      for (const r of heldRoles) {
        const rd = detail[r];
        let line = r;
        if (rd) {
          line += (rd.help ? " (" + rd.help + ")" : "") + ": score " + interval(rd.score, rd.lo, rd.hi) + " (95% interval)";
          if (rd.baseline !== null && rd.baseline !== undefined) line += ", baseline " + num(rd.baseline);
          if (rd.higher_is_better !== undefined) line += rd.higher_is_better ? "; higher is better" : "; lower is better";
        }
        dl.appendChild(el("dd", {}, line));
      }
      if (unsure.length) dl.appendChild(el("dd", {}, "uncertain (the estimate passes, the bound does not): " + unsure.join(", ")));
    }
    source_(dl, "roles", "`headscope roles MODEL --out DIR`");
    dl.appendChild(el("dt", {}, "Importance"));
    const total = INFO.n_layers * INFO.n_heads;
    for (const [m, imp] of Object.entries(H.importance || {})) {
      dl.appendChild(el("dd", {}, m + ": rank " + (imp.rank[i] === null ? "n/a" : imp.rank[i]) + " of " + total + " (" + interval(imp.values[i], (imp.lo || [])[i], (imp.hi || [])[i], 4) + ")"));
    }
    source_(dl, "importance", "`headscope score MODEL --out DIR`");
    dl.appendChild(el("dt", {}, "KV cache"));
    for (const kv of H.kvcache || []) {
      dl.appendChild(el("dd", {}, kv.label + ": " + (kv.full[i] ? "full KV" : "sink " + kv.sink + " + window " + kv.window + " only")));
    }
    source_(dl, "kvcache", "`headscope kvcache MODEL --out DIR`");
    dl.appendChild(el("dt", {}, H.patching ? patchingName().replace(/^p/, "P") : "Patching effect"));
    if (H.patching) dl.appendChild(el("dd", {}, interval(H.patching.values[i], (H.patching.lo || [])[i], (H.patching.hi || [])[i])));
    source_(dl, "patching", "`headscope patch MODEL --out DIR`");
    const paths = (H.paths || {})[headName(l, h)] || [];
    if (paths.length) {
      dl.appendChild(el("dt", {}, "Strongest paths (path patching)"));
      for (const path of paths) {
        const via = path.via === "direct" ? "" : " via " + path.via;
        dl.appendChild(el("dd", {}, path.sender + " \u2192 " + path.receiver + via + ": " + interval(path.effect, path.lo, path.hi)));
      }
      source_(dl, "paths", "`headscope patch MODEL --paths N --out DIR`");
    }
    const edges = (H.edges || {})[headName(l, h)];
    if (edges && (edges.out.length || edges.in.length)) {
      dl.appendChild(el("dt", {}, "Strongest circuit edges (edge attribution)"));
      for (const edge of edges.out) dl.appendChild(el("dd", {}, "out: " + edge.sender + " \u2192 " + edge.receiver + ": " + interval(edge.score, edge.lo, edge.hi)));
      for (const edge of edges.in) dl.appendChild(el("dd", {}, "in: " + edge.sender + " \u2192 " + edge.receiver + ": " + interval(edge.score, edge.lo, edge.hi)));
      source_(dl, "edges", "`headscope circuit MODEL --task ioi --out DIR`");
    }
    dl.appendChild(el("dt", {}, "Statistics"));
    for (const c of ["entropy_norm", "mean_distance", "first_token_mass", "prev_token_mass", "special_mass"]) {
      const stat = (H.statistics || {})[c];
      if (stat) dl.appendChild(el("dd", {}, c + ": " + interval(stat.values[i], (stat.lo || [])[i], (stat.hi || [])[i])));
    }
    source_(dl, "statistics", "`headscope analyze MODEL --out DIR`");
    box.appendChild(dl);
    return box;
  }

  // ---- every head at once (short texts) -------------------------------------------------------------
  function drawMultiples() {
    const box = $("multiples"), note = $("multiples-note");
    box.textContent = "";
    if (!state.maps) { note.textContent = "Small multiples are drawn for texts of up to " + INFO.small_max + " tokens; this one has " + (state.tokens ? state.tokens.length : 0) + "."; return; }
    note.textContent = "Each square is one head's map (rows = queries; colour = \u221aweight" + (state.weighting === "norm" ? " / the head's largest" : "") + "). Click one to show it above.";
    box.style.gridTemplateColumns = "28px repeat(" + INFO.n_heads + ", 58px)";
    const T = state.tokens.length;
    for (let l = 0; l < INFO.n_layers; l++) {
      box.appendChild(el("div", { class: "axis" }, "L" + l));
      for (let h = 0; h < INFO.n_heads; h++) {
        if (h >= INFO.heads_in_layer[l]) { box.appendChild(el("div")); continue; }
        const c = el("canvas", { width: T, height: T, "data-name": headName(l, h) });
        c.title = headName(l, h);
        paint(c, state.maps[l][h], T, T, 1, topOf(state.maps[l][h]));
        c.addEventListener("click", () => select(0, l, h));
        box.appendChild(c);
      }
    }
  }

  // ---- running a text ----------------------------------------------------------------------------------
  // `ids`: token ids to show instead of the text's own (a generated continuation), `promptLen` where it starts.
  async function run(text, ids, promptLen) {
    if (!ids && !text.trim()) { status("type a sentence first", true); return; }
    const mine = ++state.seq;
    status("running\u2026", false);
    try {
      const asked = ids ? { ids: ids.join(",") } : { text: text };
      // One head first, as a window: its answer gives the text's length, so every head's maps are asked only
      // for a text short enough to have them (no refused request on the way).
      const s = state.slots[0] || FIRST;
      const first = await api("/api/attention", weighted(Object.assign({}, asked, { layer: s[0], head: s[1], window: "0,0," + WINDOW })));
      if (mine !== state.seq) return;
      showNotes(first);
      const tokens = first.tokens;
      let maps = null;
      if (tokens.length <= INFO.small_max) { maps = (await api("/api/maps", weighted(Object.assign({}, asked)))).maps; }
      if (mine !== state.seq) return;
      Object.assign(state, { text: text, tokens: tokens, maps: maps, ids: ids || null, promptLen: ids ? promptLen : null, focus: [null, null], found: null });
      if (!ids) { state.gen = null; $("continuation").hidden = true; }
      status(tokens.length + " tokens" + (maps ? "" : " (long text: each head is computed when shown)") +
        (ids ? "; tokens " + promptLen + "\u2013" + (tokens.length - 1) + " are the model's greedy continuation" : "") +
        (first.note ? "; " + first.note : ""), false);
      drawMultiples();
      await Promise.all([drawSlot(0), drawSlot(1)]);
      writeAddress();
      document.body.dataset.drawn = String(mine);
    } catch (e) {
      if (mine === state.seq) status(e.message, true);
    }
  }
  async function generate(text, n) {
    if (!text.trim()) { status("type a sentence first", true); return; }
    status("generating " + n + " tokens\u2026", false);
    try {
      const r = await api("/api/generate", { text: text, tokens: n });
      state.gen = n;
      const p = $("continuation");
      p.textContent = "";
      p.appendChild(el("span", { class: "prompt" }, r.text));
      p.appendChild(el("mark", { class: "gen", title: "the model's greedy continuation (" + r.generated + " tokens, stopped by " + (r.stopped === "end" ? "its end-of-text token" : "the token count") + ")" }, r.continuation));
      p.hidden = false;
      await run(text, r.ids, r.prompt_tokens);
    } catch (e) { status(e.message, true); }
  }

  async function start() {
    $("title").textContent = "headscope view: " + INFO.name;
    $("meta").textContent = INFO.model_type + ", " + INFO.n_layers + " layers \u00d7 " + INFO.n_heads + " heads (" +
      INFO.n_kv_heads + " KV), " + (INFO.causal ? "causal" : "bidirectional") + "; texts up to " + INFO.max_tokens + " tokens";
    const address = STATIC ? { notes: [] } : readAddress();
    if (STATIC) { // a saved page holds one text's maps: nothing else can be computed here
      $("examples").textContent = "";
      $("examples").appendChild(el("span", { class: "hint" }, "A saved view of one text: run `headscope view MODEL` to type others."));
      $("weighting").disabled = true;
      $("weighting").title = "a saved view holds the attention probabilities only";
    } else {
      for (const ex of INFO.examples || []) {
        const b = el("button", { type: "button", class: "example" }, ex);
        b.addEventListener("click", () => { $("text").value = ex; run(ex); });
        $("examples").appendChild(b);
      }
      if (INFO.generates) {
        $("gen-box").hidden = false;
        $("gen-n").max = String(INFO.max_new_tokens);
        $("gen").addEventListener("click", () => {
          const n = Number($("gen-n").value);
          if (!Number.isInteger(n) || n < 1 || n > INFO.max_new_tokens) { status("tokens to generate: a whole number from 1 to " + INFO.max_new_tokens, true); return; }
          generate($("text").value, n);
        });
      }
    }
    $("text").addEventListener("keydown", (ev) => { if (ev.key === "Enter" && !ev.shiftKey) { ev.preventDefault(); run($("text").value); } });
    $("text").addEventListener("input", writeAddress);
    $("run").addEventListener("click", () => run($("text").value));
    $("weighting").addEventListener("change", () => {
      state.weighting = $("weighting").value;
      writeAddress();
      if (state.tokens) run(state.text, state.ids, state.promptLen);
    });
    try { state.heads = await api("/api/heads"); } catch (e) { status("heads table: " + e.message, true); }
    const sel = $("colour-by");
    for (const [v, t] of colourings()) sel.appendChild(el("option", { value: v }, t));
    sel.addEventListener("change", drawGrid);
    const H = state.heads || {}, folders = H.folders || [];
    const found = Object.values(H.sources || {}).map((src) => src.file);
    $("sources").textContent = folders.length ? "Evidence from " + folders.join(", ") + ": " + (found.join(", ") || "no result files found") : "No --from folder: the grid has no evidence to colour by.";
    const problems = H.problems || [];
    if (problems.length) status(problems.join("\n"), true); // each unusable file, one line each
    if (address.head) state.slots[0] = address.head;
    if (address.head2) state.slots[1] = address.head2;
    if (address.weighting) { state.weighting = address.weighting; $("weighting").value = address.weighting; }
    drawGrid();
    if (STATIC) {
      $("text").value = STATIC.text;
      $("text").readOnly = true;
      $("run").disabled = true;
      state.slots = STATIC.slots.concat([null]).slice(0, 2);
      drawGrid();
      await run(STATIC.text);
    } else if (address.text) {
      $("text").value = address.text;
      if (address.gen) { $("gen-n").value = String(address.gen); await generate(address.text, address.gen); } else await run(address.text);
    }
    if (address.notes.length) { // said after the run, so that its status does not hide them
      const n = $("notes");
      n.textContent = ("The address asked for something this page cannot show: " + address.notes.join("; ") + ". " + n.textContent).trim();
    }
    writeAddress();
    document.body.dataset.ready = "1";
  }
  start();
})();
