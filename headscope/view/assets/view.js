// headscope view: type text, see any head's attention beside its measured evidence.
// Every piece of data is written with textContent or setAttribute, never as markup.
"use strict";
(function () {
  const DATA = JSON.parse(document.getElementById("hs-view-data").textContent);
  const INFO = DATA.info;
  const STATIC = DATA.static; // null when served live: the script asks the server's JSON API
  const ARC_MAX = 96; // tokens up to which the arcs are drawn (the heat map draws any length)
  const COLOURS = ["#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#eeca3b", "#b279a2", "#ff9da6",
    "#9d755d", "#bab0ac", "#1b9e77", "#d95f02"];
  // The first head drawn: head 0 of the first layer that has heads (a hybrid model's layer 0 may have none).
  const FIRST = [Math.max(0, INFO.heads_in_layer.findIndex((n) => n > 0)), 0];
  const state = { heads: null, text: "", tokens: null, maps: null, slots: [FIRST, null], seq: 0 };
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
  function status(msg, isError) { const s = $("status"); s.textContent = msg; s.className = isError ? "error" : ""; }

  class ApiError extends Error { constructor(status, msg) { super(msg); this.status = status; } }

  async function api(path, params) {
    if (STATIC) return staticApi(path, params);
    const q = new URLSearchParams(params || {}).toString();
    const r = await fetch(path + (q ? "?" + q : ""), { headers: { Accept: "application/json" } });
    let body = null;
    try { body = await r.json(); } catch (e) { body = { error: "HTTP " + r.status }; }
    if (!r.ok) throw new ApiError(r.status, body.error || ("HTTP " + r.status));
    return body;
  }
  function staticApi(path, params) {
    if (path === "/api/heads") return STATIC.heads;
    if (path === "/api/maps") {
      if (!STATIC.maps) throw new ApiError(413, "every head's map is not in this static view (a long text): it holds the chosen heads only");
      return { tokens: STATIC.tokens, maps: STATIC.maps, note: STATIC.note };
    }
    const key = headName(params.layer, params.head);
    if (STATIC.maps) return { tokens: STATIC.tokens, note: STATIC.note, weights: STATIC.maps[params.layer][params.head] };
    if (STATIC.attention[key]) return { tokens: STATIC.tokens, note: STATIC.note, weights: STATIC.attention[key] };
    throw new ApiError(400, key + " is not in this static view; it holds " + Object.keys(STATIC.attention).join(", "));
  }

  // ---- the grid ------------------------------------------------------------------------------------
  function patchingName() { // the exact effect, or attribution's estimate where the run had no exact scan
    return (state.heads.patching || {}).measure === "attribution" ? "patching (attribution estimate)" : "patching effect";
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
  function cellColours(by) {
    const H = state.heads || {}, n = INFO.n_layers * INFO.n_heads, out = new Array(n).fill("rgb(225, 225, 225)");
    const legend = [];
    if (by === "roles" && H.roles) {
      const fams = {};
      let unsure = 0;
      H.roles.forEach((r, i) => {
        const first = roleList(r)[0];
        if (first) { const f = first.split(":")[0]; if (!(f in fams)) fams[f] = COLOURS[Object.keys(fams).length % COLOURS.length]; out[i] = fams[f]; }
        else if (H.uncertain && roleList(H.uncertain[i]).length) { out[i] = "rgb(150, 150, 150)"; unsure++; }
      });
      for (const [f, c] of Object.entries(fams)) legend.push([c, f]);
      if (unsure) legend.push(["rgb(150, 150, 150)", "uncertain (" + unsure + ")"]);
      legend.push(["rgb(225, 225, 225)", "no role"]);
    } else if (by.startsWith("importance:")) {
      const e = H.importance[by.slice(11)];
      const valid = e.rank.filter((r) => r !== null).length;
      e.rank.forEach((r, i) => { if (r !== null) out[i] = seq(valid - r, 0, valid - 1); });
      legend.push([seq(valid - 1, 0, valid - 1), "rank 1 (most important)"], [seq(0, 0, valid - 1), "rank " + valid]);
    } else if (by === "patching") {
      const v = H.patching.values, m = Math.max(...v.filter((x) => x !== null).map(Math.abs), 0);
      v.forEach((x, i) => { if (x !== null) out[i] = diverging(x, m); });
      legend.push([diverging(m, m), "effect " + num(m, 2)], [diverging(-m, m), "effect " + num(-m, 2)]);
    } else if (by.startsWith("stat:")) {
      const v = H.statistics[by.slice(5)].values, ok = v.filter((x) => x !== null);
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
        const c = el("div", { class: "cell" + (present ? "" : " empty"), "data-name": headName(l, h), "data-layer": l, "data-head": h });
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
    for (const [m, e] of Object.entries(H.importance || {})) lines.push(m + " rank " + (e.rank[i] === null ? "n/a" : e.rank[i]));
    if (H.patching) lines.push(patchingName() + " " + interval(H.patching.values[i], (H.patching.lo || [])[i], (H.patching.hi || [])[i]));
    return lines.join("\n");
  }

  // ---- one head: arcs, heat map, card ------------------------------------------------------------------
  async function select(slot, l, h) {
    state.slots[slot] = [l, h];
    drawGrid();
    await drawSlot(slot);
  }
  async function weightsFor(l, h) {
    if (state.maps) return state.maps[l][h];
    const r = await api("/api/attention", { text: state.text, layer: l, head: h });
    return r.weights;
  }
  async function drawSlot(slot) {
    const box = $("view-" + slot), s = state.slots[slot];
    if (!s || !state.tokens) { box.textContent = ""; return; }
    const [l, h] = s, mine = state.seq;
    let w;
    try { w = await weightsFor(l, h); } catch (e) { status(e.message, true); return; }
    if (mine !== state.seq) return; // a newer text was run meanwhile
    box.textContent = "";
    const head = el("div", { class: "panel" });
    const title = el("h3", {}, headName(l, h) + (slot === 1 ? " (right)" : ""));
    head.appendChild(title);
    if (slot === 1) { const b = el("button", { type: "button", class: "example" }, "close"); b.addEventListener("click", () => { state.slots[1] = null; drawGrid(); drawSlot(1); }); head.appendChild(b); }
    const caption = el("div", { class: "caption" }, "hover a token or a cell");
    if (state.tokens.length <= ARC_MAX) head.appendChild(arcs(w, l, h, caption));
    else head.appendChild(el("p", { class: "hint" }, "arcs are drawn up to " + ARC_MAX + " tokens; the heat map shows all " + state.tokens.length));
    head.appendChild(heatmap(w, l, h, caption));
    head.appendChild(caption);
    box.appendChild(head);
    box.appendChild(card(l, h));
  }
  function top(row, k) {
    return row.map((v, j) => [v, j]).sort((a, b) => b[0] - a[0]).slice(0, k)
      .map(([v, j]) => label(state.tokens[j]) + " " + num(v, 3)).join(", ");
  }
  function arcs(w, l, h, caption) {
    const T = state.tokens.length, rowH = 18, LABEL = 18; // longer labels are cut, the full token in its tooltip
    const shown = state.tokens.map((t) => { const s = label(t); return s.length > LABEL ? s.slice(0, LABEL - 1) + "\u2026" : s; });
    const wide = 7.3 * Math.max(...shown.map((s) => s.length)) + 8, xl = wide, xr = wide + 80, width = xr + wide;
    const g = svg("svg", { width: width, height: T * rowH + 8, "data-head": headName(l, h), class: "arcs" });
    const lines = [];
    for (let i = 0; i < T; i++) {
      for (let j = 0; j < T; j++) {
        const v = w[i][j];
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
        t.textContent = shown[i];
        const tip = svg("title");
        tip.textContent = label(state.tokens[i]) + " (token " + i + ")";
        t.appendChild(tip);
        t.addEventListener("mouseenter", () => {
          t.classList.add("on");
          if (side === "q") { show((q) => q === i); caption.textContent = "query " + i + " " + label(state.tokens[i]) + " attends to: " + top(w[i], 5); }
          else { show((q, k) => k === i); caption.textContent = "key " + i + " " + label(state.tokens[i]) + " is attended by: " + top(w.map((r) => r[i]), 5); }
        });
        t.addEventListener("mouseleave", () => { t.classList.remove("on"); show(() => true); });
        g.appendChild(t);
      }
    }
    return g;
  }
  function heatmap(w, l, h, caption) {
    const T = w.length, cell = Math.max(1, Math.min(18, Math.floor(420 / T)));
    const c = el("canvas", { width: T * cell, height: T * cell, "data-head": headName(l, h), "data-cell": cell, "data-left": 0, "data-top": 0 });
    const ctx = c.getContext("2d"), img = ctx.createImageData(T * cell, T * cell);
    for (let i = 0; i < T; i++) for (let j = 0; j < T; j++) {
      const v = Math.max(0, Math.min(1, w[i][j]));
      const rgb = [Math.round(255 - 215 * v), Math.round(255 - 170 * v), Math.round(255 - 100 * v)];
      for (let y = i * cell; y < (i + 1) * cell; y++) for (let x = j * cell; x < (j + 1) * cell; x++) {
        const p = (y * T * cell + x) * 4;
        img.data[p] = rgb[0]; img.data[p + 1] = rgb[1]; img.data[p + 2] = rgb[2]; img.data[p + 3] = 255;
      }
    }
    ctx.putImageData(img, 0, 0);
    c.addEventListener("mousemove", (ev) => {
      const r = c.getBoundingClientRect();
      const j = Math.floor((ev.clientX - r.left) / cell), i = Math.floor((ev.clientY - r.top) / cell);
      if (i < 0 || j < 0 || i >= T || j >= T) return;
      caption.textContent = "query " + i + " " + label(state.tokens[i]) + " \u2192 key " + j + " " + label(state.tokens[j]) + ": " + num(w[i][j], 4);
    });
    return c;
  }
  function source(dl, what, runHint) {
    const src = ((state.heads || {}).sources || {})[what];
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
      const held = roleList(H.roles[i]), unsure = H.uncertain ? roleList(H.uncertain[i]) : [];
      const detail = (H.role_detail || {})[name] || [];
      if (!held.length) dl.appendChild(el("dd", {}, "no role above its baseline"));
      for (const r of held) {
        const d = detail.find((x) => x.role === r);
        dl.appendChild(el("dd", {}, r + (d ? ": score " + interval(d.score, d.lo, d.hi) + (d.baseline !== null && d.baseline !== undefined ? ", baseline " + num(d.baseline) : "") : "")));
      }
      if (unsure.length) dl.appendChild(el("dd", {}, "uncertain (the estimate passes, the bound does not): " + unsure.join(", ")));
    }
    source(dl, "roles", "`headscope roles MODEL --out DIR`");
    dl.appendChild(el("dt", {}, "Importance"));
    const total = INFO.n_layers * INFO.n_heads;
    for (const [m, e] of Object.entries(H.importance || {})) {
      dl.appendChild(el("dd", {}, m + ": rank " + (e.rank[i] === null ? "n/a" : e.rank[i]) + " of " + total + " (" + interval(e.values[i], (e.lo || [])[i], (e.hi || [])[i], 4) + ")"));
    }
    source(dl, "importance", "`headscope score MODEL --out DIR`");
    dl.appendChild(el("dt", {}, "KV cache"));
    for (const k of H.kvcache || []) {
      dl.appendChild(el("dd", {}, k.label + ": " + (k.full[i] ? "full KV" : "sink " + k.sink + " + window " + k.window + " only")));
    }
    source(dl, "kvcache", "`headscope kvcache MODEL --out DIR`");
    dl.appendChild(el("dt", {}, H.patching ? patchingName().replace(/^p/, "P") : "Patching effect"));
    if (H.patching) dl.appendChild(el("dd", {}, interval(H.patching.values[i], (H.patching.lo || [])[i], (H.patching.hi || [])[i])));
    source(dl, "patching", "`headscope patch MODEL --out DIR`");
    const paths = (H.paths || {})[headName(l, h)] || [];
    if (paths.length) {
      dl.appendChild(el("dt", {}, "Strongest paths (path patching)"));
      for (const p of paths) {
        const via = p.via === "direct" ? "" : " via " + p.via;
        dl.appendChild(el("dd", {}, p.sender + " \u2192 " + p.receiver + via + ": " + interval(p.effect, p.lo, p.hi)));
      }
      source(dl, "paths", "`headscope patch MODEL --paths N --out DIR`");
    }
    dl.appendChild(el("dt", {}, "Statistics"));
    for (const c of ["entropy_norm", "mean_distance", "first_token_mass", "prev_token_mass", "special_mass"]) {
      const e = (H.statistics || {})[c];
      if (e) dl.appendChild(el("dd", {}, c + ": " + interval(e.values[i], (e.lo || [])[i], (e.hi || [])[i])));
    }
    source(dl, "statistics", "`headscope analyze MODEL --out DIR`");
    box.appendChild(dl);
    return box;
  }

  // ---- every head at once (short texts) -------------------------------------------------------------
  function drawMultiples() {
    const box = $("multiples"), note = $("multiples-note");
    box.textContent = "";
    if (!state.maps) { note.textContent = "Small multiples are drawn for texts of up to " + INFO.small_max + " tokens; this one has " + (state.tokens ? state.tokens.length : 0) + "."; return; }
    note.textContent = "Each square is one head's map (rows = queries). Click one to show it above.";
    box.style.gridTemplateColumns = "28px repeat(" + INFO.n_heads + ", 58px)";
    const T = state.tokens.length;
    for (let l = 0; l < INFO.n_layers; l++) {
      box.appendChild(el("div", { class: "axis" }, "L" + l));
      for (let h = 0; h < INFO.n_heads; h++) {
        if (h >= INFO.heads_in_layer[l]) { box.appendChild(el("div")); continue; }
        const c = el("canvas", { width: T, height: T, "data-name": headName(l, h) });
        c.title = headName(l, h);
        const ctx = c.getContext("2d"), img = ctx.createImageData(T, T), w = state.maps[l][h];
        for (let i = 0; i < T; i++) for (let j = 0; j < T; j++) {
          const v = Math.max(0, Math.min(1, w[i][j])), p = (i * T + j) * 4;
          img.data[p] = 255 - 215 * v; img.data[p + 1] = 255 - 170 * v; img.data[p + 2] = 255 - 100 * v; img.data[p + 3] = 255;
        }
        ctx.putImageData(img, 0, 0);
        c.addEventListener("click", () => select(0, l, h));
        box.appendChild(c);
      }
    }
  }

  // ---- running a text ----------------------------------------------------------------------------------
  async function run(text) {
    if (!text.trim()) { status("type a sentence first", true); return; }
    const mine = ++state.seq;
    status("running\u2026", false);
    try {
      let maps = null, tokens = null, note = null;
      try { const r = await api("/api/maps", { text: text }); maps = r.maps; tokens = r.tokens; note = r.note; }
      catch (e) { if (e.status !== 413 || !(String(e.message).includes("every head"))) throw e; }
      if (!maps) { const s = state.slots[0] || FIRST; const r = await api("/api/attention", { text: text, layer: s[0], head: s[1] }); tokens = r.tokens; note = r.note; }
      if (mine !== state.seq) return;
      Object.assign(state, { text: text, tokens: tokens, maps: maps });
      status(tokens.length + " tokens" + (maps ? "" : " (long text: each head is computed when shown)") + (note ? "; " + note : ""), false);
      drawMultiples();
      await Promise.all([drawSlot(0), drawSlot(1)]);
      document.body.dataset.drawn = String(mine);
    } catch (e) {
      if (mine === state.seq) status(e.message, true);
    }
  }

  async function start() {
    $("title").textContent = "headscope view: " + INFO.name;
    $("meta").textContent = INFO.model_type + ", " + INFO.n_layers + " layers \u00d7 " + INFO.n_heads + " heads (" +
      INFO.n_kv_heads + " KV), " + (INFO.causal ? "causal" : "bidirectional") + "; texts up to " + INFO.max_tokens + " tokens";
    for (const ex of INFO.examples || []) {
      const b = el("button", { type: "button", class: "example" }, ex);
      b.addEventListener("click", () => { $("text").value = ex; run(ex); });
      $("examples").appendChild(b);
    }
    $("text").addEventListener("keydown", (ev) => { if (ev.key === "Enter" && !ev.shiftKey) { ev.preventDefault(); run($("text").value); } });
    $("run").addEventListener("click", () => run($("text").value));
    try { state.heads = await api("/api/heads"); } catch (e) { status("heads table: " + e.message, true); }
    const sel = $("colour-by");
    for (const [v, t] of colourings()) sel.appendChild(el("option", { value: v }, t));
    sel.addEventListener("change", drawGrid);
    const folders = (state.heads || {}).folders || [];
    const found = Object.values((state.heads || {}).sources || {}).map((s) => s.file);
    $("sources").textContent = folders.length ? "Evidence from " + folders.join(", ") + ": " + (found.join(", ") || "no result files found") : "No --from folder: the grid has no evidence to colour by.";
    const problems = (state.heads || {}).problems || [];
    if (problems.length) status(problems.join("\n"), true); // each unusable file, one line each
    drawGrid();
    if (STATIC) {
      $("text").value = STATIC.text;
      $("text").readOnly = true;
      $("run").disabled = true;
      state.slots = STATIC.slots.concat([null]).slice(0, 2);
      drawGrid();
      await run(STATIC.text);
    }
    document.body.dataset.ready = "1";
  }
  start();
})();
