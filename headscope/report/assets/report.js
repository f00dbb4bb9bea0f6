/* headscope report: plain JavaScript, no libraries, no network. Everything is drawn from the JSON
   embedded in the page (the element with id hs-data). */
(function () {
  'use strict';
  var D = JSON.parse(document.getElementById('hs-data').textContent);
  var L = D.n_layers, H = D.n_heads;
  var selected = null;

  function $(id) { return document.getElementById(id); }
  function el(tag, attrs) {
    var e = document.createElement(tag);
    if (attrs) {
      Object.keys(attrs).forEach(function (k) {
        if (k === 'text') e.textContent = attrs[k];
        else if (k === 'cls') e.className = attrs[k];
        else e.setAttribute(k, attrs[k]);
      });
    }
    for (var i = 2; i < arguments.length; i++) {
      var kid = arguments[i];
      if (kid === null || kid === undefined) continue;
      e.appendChild(typeof kid === 'string' ? document.createTextNode(kid) : kid);
    }
    return e;
  }
  function fmt(v) {
    if (v === null || v === undefined || (typeof v === 'number' && isNaN(v))) return '–';
    if (typeof v === 'number') {
      if (Number.isInteger(v)) return String(v);
      var a = Math.abs(v);
      if (a !== 0 && (a < 0.001 || a >= 1e5)) return v.toExponential(2);
      return v.toFixed(a < 10 ? 3 : 1);
    }
    if (typeof v === 'object') return JSON.stringify(v);
    return String(v);
  }
  function headName(l, h) { return 'L' + l + 'H' + h; }
  // Inline `code` in generated sentences, built as DOM nodes (never innerHTML of data).
  function richText(s) {
    var p = el('p');
    String(s).split('`').forEach(function (part, i) {
      p.appendChild(i % 2 ? el('code', { text: part }) : document.createTextNode(part));
    });
    return p;
  }
  function missing(key) {
    var na = (D.na || {})[key];
    if (na) return el('p', { cls: 'na', 'data-na': key, text: na });  // a study's one line: not a to-do
    var msg = D.missing[key];
    return msg ? el('div', { cls: 'missing', 'data-missing': key }, richText(msg)) : null;
  }
  function table(columns, rows, opts) {
    opts = opts || {};
    var t = el('table', { cls: 'data' });
    var tr = el('tr');
    columns.forEach(function (c) { tr.appendChild(el('th', { text: c })); });
    t.appendChild(tr);
    rows.slice(0, opts.max || rows.length).forEach(function (r) {
      var row = el('tr');
      if (opts.rowClass) row.className = opts.rowClass(r);
      columns.forEach(function (c) {
        var v = Array.isArray(r) ? r[columns.indexOf(c)] : r[c];
        row.appendChild(el('td', { cls: typeof v === 'number' ? '' : 'txt', text: fmt(v) }));
      });
      t.appendChild(row);
    });
    return t;
  }
  // A value and its 95% interval as one cell ("0.052 [0.049, 0.055]"); the value alone where the file has
  // no interval for it (only JS divergence has one: similar resamples passages for it).
  function withInterval(r, c) {
    var lo = r[c + '_lo'], hi = r[c + '_hi'];
    if (lo === null || lo === undefined || hi === null || hi === undefined) return fmt(r[c]);
    return fmt(r[c]) + ' [' + fmt(lo) + ', ' + fmt(hi) + ']';
  }
  // The similarity columns a table shows: the measures, not their bounds (shown inside their cell).
  function similarityMetrics(columns) {
    return columns.filter(function (c) {
      return c !== 'head_a' && c !== 'head_b' && !/_(lo|hi)$/.test(c) && c !== 'same_layer';
    }).slice(0, 4);
  }
  function collapsible(label, content) {
    return el('details', null, el('summary', { text: label }), content);
  }

  // --- colours ----------------------------------------------------------------------------------
  var VIRIDIS = [[68, 1, 84], [72, 40, 120], [62, 74, 137], [49, 104, 142], [38, 130, 142], [31, 158, 137],
    [53, 183, 121], [110, 206, 88], [181, 222, 43], [253, 231, 37]];
  function ramp(stops, t) {
    t = Math.max(0, Math.min(1, t));
    var x = t * (stops.length - 1), i = Math.min(Math.floor(x), stops.length - 2), f = x - i;
    var a = stops[i], b = stops[i + 1];
    return [0, 1, 2].map(function (k) { return Math.round(a[k] + (b[k] - a[k]) * f); });
  }
  function rgb(c) { return 'rgb(' + c.join(',') + ')'; }
  function inkFor(c) { return (0.299 * c[0] + 0.587 * c[1] + 0.114 * c[2]) > 140 ? '#111' : '#fff'; }
  var BLUES = [[255, 255, 255], [198, 219, 239], [107, 174, 214], [33, 113, 181], [8, 48, 107]];
  var DIVERGE = [[178, 24, 43], [239, 138, 98], [247, 247, 247], [103, 169, 207], [33, 102, 172]];
  var CATEGORY = ['#4e79a7', '#f28e2b', '#e15759', '#76b7b2', '#59a14f', '#edc948', '#b07aa1', '#ff9da7',
    '#9c755f', '#17becf', '#bcbd22', '#8c564b'];
  var NONE = [225, 225, 225];
  var UNCERTAIN = [150, 150, 150];  // a head whose only roles are uncertain (point estimate passes, bound does not)
  function hexToRgb(h) { return [1, 3, 5].map(function (i) { return parseInt(h.substr(i, 2), 16); }); }
  function range(values) {
    var lo = Infinity, hi = -Infinity;
    values.forEach(function (v) { if (typeof v === 'number' && isFinite(v)) { lo = Math.min(lo, v); hi = Math.max(hi, v); } });
    return lo === Infinity ? [0, 1] : [lo, hi];
  }

  // --- header and summaries ---------------------------------------------------------------------
  function renderHeader() {
    var m = D.model || {};
    $('title').textContent = 'headscope report: ' + (m.model || 'model');
    var bits = [L + ' layers × ' + H + ' heads'];
    if (m.n_kv_heads !== undefined && m.n_kv_heads !== null) bits.push(m.n_kv_heads + ' KV heads');
    if (m.d_head) bits.push('d_head ' + m.d_head);
    if (m.model_type) bits.push(m.model_type + (m.causal ? ', causal' : ', bidirectional'));
    if (m.data) bits.push('statistics from ' + m.data + (m.tokens_seen ? ' (' + m.tokens_seen + ' tokens)' : ''));
    $('meta').textContent = bits.join(' · ');
    // Files found but not usable (unreadable, or lacking the columns their verb writes): said up front.
    (D.problems || []).forEach(function (msg) {
      $('meta').parentNode.appendChild(el('div', { cls: 'problem' }, richText(msg)));
    });
    if (D.study && D.study.answers && D.study.answers.length) {  // a study's answer heads the page
      var sb = $('study-text');
      D.study.answers.forEach(function (s) { sb.appendChild(el('p', { text: s })); });
      $('study').hidden = false;
    }
    ['q1', 'q2', 'q3'].forEach(function (q) {
      var box = $(q + '-text');
      (D.text[q] || []).forEach(function (s) { box.appendChild(richText(s)); });
      if (!(D.text[q] || []).length) box.appendChild(el('p', { text: 'Nothing measured for this question yet; see the notes below.' }));
    });
  }

  // --- question 1: the grid -------------------------------------------------------------------------
  var colourCache = {};
  function cellColours(col) {
    if (colourCache[col]) return colourCache[col];
    var out = { colours: [], labels: [], legend: null };
    if (col === 'roles') {
      // Colour by the role family (syntactic:nsubj -> syntactic) so a few colours stay distinguishable.
      var fam = function (x) { return x.split(':')[0]; };
      var counts = {};
      D.roles.forEach(function (r) {
        var seen = {};  // count heads, not role entries: one head may hold several syntactic roles
        r.split(';').forEach(function (x) { if (x && !seen[fam(x)]) { seen[fam(x)] = 1; counts[fam(x)] = (counts[fam(x)] || 0) + 1; } });
      });
      var names = Object.keys(counts).sort(function (a, b) { return counts[b] - counts[a]; });
      var unsure = 0;
      D.roles.forEach(function (r, k) {
        var first = r ? fam(r.split(';')[0]) : '';
        var u = !first && D.uncertain && D.uncertain[k] ? fam(D.uncertain[k].split(';')[0]) : '';
        unsure += u ? 1 : 0;
        var c = first ? hexToRgb(CATEGORY[names.indexOf(first) % CATEGORY.length]) : (u ? UNCERTAIN : NONE);
        out.colours.push(c);
        out.labels.push(first ? first.slice(0, 4) + (r.split(';').length > 1 ? '+' : '') : (u ? u.slice(0, 4) + '?' : ''));
      });
      out.legend = { roles: names, counts: counts, uncertain: unsure };
    } else {
      var vals = D.columns[col], r = range(vals);
      vals.forEach(function (v) {
        var ok = typeof v === 'number' && isFinite(v);
        var c = ok ? ramp(VIRIDIS, (v - r[0]) / ((r[1] - r[0]) || 1)) : NONE;
        out.colours.push(c);
        out.labels.push(ok ? (Math.abs(v) >= 10 ? v.toFixed(0) : v.toFixed(2)) : '');
      });
      out.legend = { min: r[0], max: r[1] };
    }
    colourCache[col] = out;
    return out;
  }
  function paintGrid(col) {
    var cc = cellColours(col);
    var cells = document.querySelectorAll('#grid .cell');
    for (var i = 0; i < cells.length; i++) {
      var k = +cells[i].dataset.index;
      cells[i].style.backgroundColor = rgb(cc.colours[k]);
      cells[i].style.color = inkFor(cc.colours[k]);
      cells[i].textContent = cc.labels[k];
    }
    var lg = $('legend');
    lg.textContent = '';
    if (cc.legend.roles) {
      cc.legend.roles.forEach(function (r, i) {
        lg.appendChild(el('span', null, el('span', { cls: 'swatch', style: 'background:' + CATEGORY[i % CATEGORY.length] }),
          r + ' (' + cc.legend.counts[r] + ')'));
      });
      if (cc.legend.uncertain) {
        lg.appendChild(el('span', null, el('span', { cls: 'swatch', style: 'background:' + rgb(UNCERTAIN) }),
          'uncertain (' + cc.legend.uncertain + '): a rule passes on the estimate, not on its confidence bound'));
      }
      lg.appendChild(el('span', null, el('span', { cls: 'swatch', style: 'background:' + rgb(NONE) }), 'no role'));
      lg.appendChild(el('span', { text: '(colour = first role; + = more roles; hover for all)' }));
    } else {
      var stops = [0, 0.25, 0.5, 0.75, 1].map(function (t) { return rgb(ramp(VIRIDIS, t)); }).join(',');
      lg.appendChild(el('span', { text: fmt(cc.legend.min) }));
      lg.appendChild(el('span', { cls: 'bar', style: 'background:linear-gradient(to right,' + stops + ')' }));
      lg.appendChild(el('span', { text: fmt(cc.legend.max) }));
    }
    $('colour-desc').textContent = D.descriptions[col] || (col.indexOf('importance_') === 0 ?
      'importance by ' + col.slice(11) + ' (higher = more important)' : '');
  }
  function headNumbers(k) {
    var rows = [];
    if (D.roles) rows.push(['roles', D.roles[k] || '(none)']);
    if (D.uncertain && D.uncertain[k]) rows.push(['uncertain roles', D.uncertain[k]]);
    // a column's interval bounds (`<name>_lo`, `<name>_hi`) are shown with it: value [lo, hi]
    Object.keys(D.columns).forEach(function (c) {
      if (/_(lo|hi)$/.test(c) && D.columns[c.slice(0, -3)]) return;
      var lo = D.columns[c + '_lo'], hi = D.columns[c + '_hi'];
      var v = D.columns[c][k];
      rows.push([c, lo && hi && typeof v === 'number' && typeof lo[k] === 'number' && typeof hi[k] === 'number' ?
        fmt(v) + ' [' + fmt(lo[k]) + ', ' + fmt(hi[k]) + ']' : v]);
    });
    return rows;
  }
  function renderGrid() {
    var box = $('grid-box');
    if (!L || !H || (!Object.keys(D.columns).length && !D.roles)) {
      box.appendChild(missing('heads') || el('div', { cls: 'missing', text: 'no per-head numbers' }));
      return;
    }
    var sel = $('colour-by');
    var opts = [];
    if (D.roles) opts.push('roles');
    Object.keys(D.columns).forEach(function (c) { opts.push(c); });
    opts.forEach(function (c) { sel.appendChild(el('option', { value: c, text: c })); });
    var first = D.roles ? 'roles' : (D.columns.entropy_norm ? 'entropy_norm' : opts[0]);
    sel.value = first;
    var grid = $('grid');
    if (H > 16) grid.classList.add('compact');
    grid.style.gridTemplateColumns = '28px repeat(' + H + ', auto)';
    grid.appendChild(el('div', { cls: 'lab' }));
    for (var h = 0; h < H; h++) grid.appendChild(el('div', { cls: 'lab', text: 'H' + h }));
    var tip = $('tooltip');
    for (var l = 0; l < L; l++) {
      grid.appendChild(el('div', { cls: 'lab', text: 'L' + l }));
      for (h = 0; h < H; h++) {
        var k = l * H + h;
        var c = el('div', { cls: 'cell', 'data-index': k, 'data-layer': l, 'data-head': h, 'data-name': headName(l, h),
          role: 'button', 'aria-label': headName(l, h) });
        grid.appendChild(c);
      }
    }
    grid.addEventListener('mousemove', function (ev) {
      var c = ev.target.closest('.cell');
      if (!c) { tip.style.display = 'none'; return; }
      var k = +c.dataset.index;
      tip.textContent = '';
      tip.appendChild(el('b', { text: c.dataset.name }));
      var t = el('table');
      headNumbers(k).forEach(function (r) { t.appendChild(el('tr', null, el('td', { text: r[0] }), el('td', { text: fmt(r[1]) }))); });
      tip.appendChild(t);
      tip.style.display = 'block';
      var x = ev.clientX + 14, y = ev.clientY + 14;
      if (x + 300 > window.innerWidth) x = ev.clientX - 310;
      if (y + tip.offsetHeight > window.innerHeight) y = Math.max(0, window.innerHeight - tip.offsetHeight - 4);
      tip.style.left = x + 'px'; tip.style.top = y + 'px';
    });
    grid.addEventListener('mouseleave', function () { tip.style.display = 'none'; });
    grid.addEventListener('click', function (ev) {
      var c = ev.target.closest('.cell');
      if (c) selectHead(+c.dataset.layer, +c.dataset.head);
    });
    sel.addEventListener('change', function () { paintGrid(sel.value); });
    paintGrid(first);
  }

  // --- question 1: one head ---------------------------------------------------------------------
  var decoded = [];
  function b64bytes(s) {
    var bin = atob(s), out = new Uint8Array(bin.length);
    for (var i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
    return out;
  }
  function mapValue(si, l, h, q, k) {
    var ex = D.examples[si], n = ex.tokens.length;
    if (!decoded[si]) decoded[si] = b64bytes(ex.maps);
    var b = decoded[si];
    if (ex.causal) {
      if (k > q) return 0;
      var tri = n * (n + 1) / 2;
      return b[(l * H + h) * tri + q * (q + 1) / 2 + k] / 255;
    }
    return b[(((l * H + h) * n) + q) * n + k] / 255;
  }
  function drawMap(si, l, h) {
    var ex = D.examples[si], n = ex.tokens.length, toks = ex.tokens;
    var cell = Math.max(10, Math.min(20, Math.floor(380 / n)));
    var canvas = el('canvas', { 'data-head': headName(l, h), 'data-sentence': si });
    var ctx = canvas.getContext('2d');
    ctx.font = '11px system-ui, sans-serif';
    var wmax = 0;
    toks.forEach(function (t) { wmax = Math.max(wmax, ctx.measureText(t).width); });
    var left = Math.ceil(Math.min(wmax, 110)) + 8, top = left;
    canvas.width = left + n * cell + 2; canvas.height = top + n * cell + 2;
    canvas.dataset.left = left; canvas.dataset.top = top; canvas.dataset.cell = cell;
    ctx = canvas.getContext('2d');
    ctx.font = '11px system-ui, sans-serif';
    ctx.fillStyle = '#fff'; ctx.fillRect(0, 0, canvas.width, canvas.height);
    for (var q = 0; q < n; q++) {
      for (var k = 0; k < n; k++) {
        var p = mapValue(si, l, h, q, k);
        // sqrt makes weak but real attention visible next to a dominant key
        ctx.fillStyle = rgb(ramp(BLUES, Math.sqrt(p)));
        ctx.fillRect(left + k * cell, top + q * cell, cell, cell);
      }
    }
    ctx.strokeStyle = '#ccc'; ctx.strokeRect(left - 0.5, top - 0.5, n * cell + 1, n * cell + 1);
    ctx.fillStyle = '#333'; ctx.textBaseline = 'middle'; ctx.textAlign = 'right';
    toks.forEach(function (t, i) { ctx.fillText(t.slice(0, 16), left - 4, top + i * cell + cell / 2); });
    toks.forEach(function (t, i) {
      ctx.save(); ctx.translate(left + i * cell + cell / 2, top - 4); ctx.rotate(-Math.PI / 2);
      ctx.textAlign = 'left'; ctx.fillText(t.slice(0, 16), 0, 0); ctx.restore();
    });
    var cap = el('div', { cls: 'caption map-caption', text: 'rows: query token, columns: key token; hover for weights' });
    canvas.addEventListener('mousemove', function (ev) {
      var r = canvas.getBoundingClientRect();
      var kx = Math.floor((ev.clientX - r.left - left) / cell), qy = Math.floor((ev.clientY - r.top - top) / cell);
      if (kx >= 0 && qy >= 0 && kx < n && qy < n) {
        cap.textContent = toks[qy] + ' (' + qy + ') → ' + toks[kx] + ' (' + kx + '): ' + mapValue(si, l, h, qy, kx).toFixed(3);
      }
    });
    return el('div', { cls: 'map-box' }, el('div', { cls: 'caption', text: 'sentence ' + (si + 1) + ' (' + n + ' tokens)' }),
      canvas, cap);
  }
  function roleScoreTable(rec) {
    // Scores come as {role: {score, baseline, ...}} or flat {role: x, role_baseline: y}; show both.
    var keys = Object.keys(rec);
    var nested = keys.filter(function (k) { return rec[k] && typeof rec[k] === 'object' && !Array.isArray(rec[k]); });
    if (nested.length) {
      var cols = [];
      nested.forEach(function (k) { Object.keys(rec[k]).forEach(function (c) { if (cols.indexOf(c) < 0) cols.push(c); }); });
      var rows = nested.map(function (k) { var r = { measure: k }; cols.forEach(function (c) { r[c] = rec[k][c]; }); return r; });
      var sc = cols.indexOf('score') >= 0 ? 'score' : cols[0];
      var bl = cols.filter(function (c) { return c.indexOf('baseline') >= 0; })[0];
      return table(['measure'].concat(cols), rows, { rowClass: function (r) {
        if (!(bl && typeof r[sc] === 'number' && typeof r[bl] === 'number')) return '';
        var lower = r['beats baseline when'] === 'lower';
        return (lower ? r[sc] < r[bl] : r[sc] > r[bl]) ? 'beats' : ''; } });
    }
    var base = keys.filter(function (k) { return /baseline/.test(k); });
    var plain = keys.filter(function (k) { return base.indexOf(k) < 0; });
    var rows2 = plain.map(function (k) {
      var b = base.filter(function (x) { return x.indexOf(k) === 0 || x.replace(/_?baseline_?/, '') === k; })[0];
      return { score: k, value: rec[k], baseline: b !== undefined ? rec[b] : null };
    });
    return table(['score', 'value', 'baseline'], rows2, { rowClass: function (r) {
      return typeof r.value === 'number' && typeof r.baseline === 'number' && r.value > r.baseline ? 'beats' : ''; } });
  }
  function selectHead(l, h) {
    var name = headName(l, h), k = l * H + h;
    document.querySelectorAll('#grid .cell.selected').forEach(function (c) { c.classList.remove('selected'); });
    var cell = document.querySelector('#grid .cell[data-index="' + k + '"]');
    if (cell) cell.classList.add('selected');
    selected = name;
    var box = $('head-detail');
    box.textContent = '';
    box.setAttribute('data-head', name);
    box.appendChild(el('h3', { text: name + (D.roles && D.roles[k] ? ' — ' + D.roles[k].split(';').join(', ') : '') }));
    if (D.examples.length) {
      box.appendChild(el('h4', { text: 'Attention on the example sentences' }));
      var maps = el('div', { cls: 'maps' });
      D.examples.forEach(function (_, si) { maps.appendChild(drawMap(si, l, h)); });
      box.appendChild(maps);
    } else {
      box.appendChild(missing('examples'));
    }
    var flex = el('div', { cls: 'flex' });
    var numbers = el('div', null, el('h4', { text: 'Numbers' }), table(['column', 'value'], headNumbers(k)));
    flex.appendChild(numbers);
    var rs = el('div', null, el('h4', { text: 'Role scores vs baselines' }),
      el('p', { cls: 'hint', text: 'green: on the role\'s side of its baseline (a role also needs the margins in roles.json)' }));
    if (D.role_scores && D.role_scores[name]) rs.appendChild(roleScoreTable(D.role_scores[name]));
    else rs.appendChild(missing('roles') || el('p', { cls: 'hint', text: 'no role scores for this head' }));
    flex.appendChild(rs);
    if (D.similarity && D.similarity.pairs) {
      var near = D.similarity.pairs.filter(function (r) { return r.head_a === name || r.head_b === name; }).slice(0, 6);
      var sb = el('div', null, el('h4', { text: 'Most similar heads' }));
      var metrics = similarityMetrics(D.similarity.pairs_columns);
      var rowsN = near.map(function (r) {
        var o = { head: r.head_a === name ? r.head_b : r.head_a };
        metrics.forEach(function (c) { o[c] = withInterval(r, c); });
        return o;
      });
      if (near.length) sb.appendChild(table(['head'].concat(metrics), rowsN));
      else sb.appendChild(el('p', { cls: 'hint', text: 'not among the top similar pairs' }));
      flex.appendChild(sb);
    }
    box.appendChild(flex);
  }

  // --- question 1: syntax and similarity --------------------------------------------------------
  function renderCensus() {
    var box = $('census');
    if (!D.census) { box.appendChild(missing('roles')); return; }
    box.appendChild(el('p', { cls: 'hint', text: 'Each role, how many heads hold it above its baseline, and the strongest of them.' }));
    box.appendChild(table(D.census.length && 'uncertain' in D.census[0] ? ['role', 'heads', 'uncertain', 'best'] :
      ['role', 'heads', 'best'], D.census));
  }
  function renderSyntax() {
    var box = $('syntax');
    if (!D.syntax) { box.appendChild(missing('syntax')); return; }
    var s = D.syntax;
    box.appendChild(el('p', { cls: 'hint', text: s.note || '' }));
    box.appendChild(table(s.columns, s.best, { max: 40, rowClass: function (r) {
      return s.baseline && typeof r[s.accuracy] === 'number' && r[s.accuracy] > r[s.baseline] ? 'beats' : ''; } }));
  }
  function drawMatrix(m, N, names) {
    var px = Math.max(1, Math.min(16, Math.floor(480 / N)));
    var canvas = el('canvas', { width: N * px, height: N * px, 'data-matrix': '1' });
    var ctx = canvas.getContext('2d'), bytes = b64bytes(m.data);
    var img = ctx.createImageData(N * px, N * px);
    for (var i = 0; i < N; i++) for (var j = 0; j < N; j++) {
      var c = ramp(VIRIDIS, bytes[i * N + j] / 255);
      for (var a = 0; a < px; a++) for (var b = 0; b < px; b++) {
        var o = ((i * px + a) * N * px + (j * px + b)) * 4;
        img.data[o] = c[0]; img.data[o + 1] = c[1]; img.data[o + 2] = c[2]; img.data[o + 3] = 255;
      }
    }
    ctx.putImageData(img, 0, 0);
    var cap = el('div', { cls: 'caption', text: 'heads in layer order on both axes; range ' + fmt(m.min) + ' to ' + fmt(m.max) });
    canvas.addEventListener('mousemove', function (ev) {
      var r = canvas.getBoundingClientRect();
      var i = Math.floor((ev.clientY - r.top) / px), j = Math.floor((ev.clientX - r.left) / px);
      if (i >= 0 && j >= 0 && i < N && j < N) {
        cap.textContent = names[i] + ' vs ' + names[j] + ': ' + fmt(m.min + (m.max - m.min) * bytes[i * N + j] / 255);
      }
    });
    return el('div', null, canvas, cap);
  }
  function renderSimilarity() {
    var box = $('similarity');
    var s = D.similarity;
    if (!s) { box.appendChild(missing('similarity')); return; }
    var flex = el('div', { cls: 'flex' });
    if (s.pairs) {
      var shown = ['head_a', 'head_b'].concat(similarityMetrics(s.pairs_columns));
      var cells = s.pairs.map(function (r) {
        var o = { head_a: r.head_a, head_b: r.head_b };
        shown.slice(2).forEach(function (c) { o[c] = withInterval(r, c); });
        return o;
      });
      flex.appendChild(el('div', null, el('h4', { text: 'Most similar pairs' }),
        el('p', { cls: 'hint', text: 'js: Jensen-Shannon divergence of the attention maps with its 95% interval over passages (lower = more alike); cka, ov/qk cosines: higher = more alike' }),
        table(shown, cells, { max: 15 })));
    }
    if (s.clusters) {
      var multi = s.clusters.filter(function (c) { return c.heads.length > 1; });
      var ul = el('ul');
      multi.slice(0, 20).forEach(function (c) { ul.appendChild(el('li', { text: c.heads.join(', ') })); });
      if (!multi.length) ul.appendChild(el('li', { text: 'every head is its own cluster' }));
      flex.appendChild(el('div', null, el('h4', { text: 'Redundancy clusters (' + multi.length + ' with more than one head)' }), ul));
    }
    if (s.matrices) {
      var names = [];
      for (var l = 0; l < L; l++) for (var h = 0; h < H; h++) names.push(headName(l, h));
      var keys = Object.keys(s.matrices), N = L * H;
      var holder = el('div');
      var sel = el('select', { id: 'matrix-by' });
      keys.forEach(function (k) { sel.appendChild(el('option', { value: k, text: k })); });
      var show = function () { holder.textContent = ''; holder.appendChild(drawMatrix(s.matrices[sel.value], N, names)); };
      sel.addEventListener('change', show);
      flex.appendChild(el('div', null, el('h4', null, 'Similarity matrix ', sel), holder));
      show();
    }
    box.appendChild(flex);
  }

  // --- question 2 -------------------------------------------------------------------------------
  function renderQ2() {
    var sw = $('sweep');
    if (D.sweep) {
      if (D.sweep.plot) sw.appendChild(el('img', { cls: 'plot', src: D.sweep.plot, alt: 'sweep plot' }));
      if (D.sweep.plot_speed) sw.appendChild(el('img', { cls: 'plot', src: D.sweep.plot_speed, alt: 'sweep speed plot' }));
      sw.appendChild(collapsible('sweep.csv (' + D.sweep.rows.length + ' rows)', table(D.sweep.columns, D.sweep.rows)));
    } else sw.appendChild(missing('sweep'));
    var kv = $('kv');
    if (D.kv) {
      kv.appendChild(table(D.kv.columns, D.kv.rows));
      kv.appendChild(el('p', { cls: 'hint', text: D.kv.source }));
    } else kv.appendChild(missing('kv'));
    var g = $('gqa');
    if (D.gqa) {
      var keys = Object.keys(D.gqa.summary);
      g.appendChild(table(['', 'value'], keys.map(function (k) { return [k, D.gqa.summary[k]]; })));
      if (Object.keys(D.gqa.details).length) g.appendChild(collapsible('details', el('pre', { cls: 'json', text: JSON.stringify(D.gqa.details, null, 1) })));
    } else g.appendChild(missing('gqa'));
  }

  // --- question 3 -------------------------------------------------------------------------------
  function miniGrid(col) {
    var vals = D.columns[col], cell = Math.max(4, Math.min(18, Math.floor(200 / Math.max(H, L / 2))));
    var canvas = el('canvas', { width: H * cell, height: L * cell, 'data-importance': col });
    var ctx = canvas.getContext('2d');
    // rank scale: criteria have different units, ranks make them comparable side by side
    var idx = [];
    vals.forEach(function (v, i) { if (typeof v === 'number' && isFinite(v)) idx.push(i); });
    idx.sort(function (a, b) { return vals[a] - vals[b]; });
    var rank = {};
    idx.forEach(function (i, r) { rank[i] = r / Math.max(1, idx.length - 1); });
    for (var k = 0; k < vals.length; k++) {
      ctx.fillStyle = rank[k] === undefined ? rgb(NONE) : rgb(ramp(VIRIDIS, rank[k]));
      ctx.fillRect((k % H) * cell, Math.floor(k / H) * cell, cell - 1, cell - 1);
    }
    canvas.title = col;
    canvas.addEventListener('click', function (ev) {
      var r = canvas.getBoundingClientRect();
      var h = Math.floor((ev.clientX - r.left) / cell), l = Math.floor((ev.clientY - r.top) / cell);
      if (l < L && h < H) { $('colour-by').value = col; paintGrid(col); selectHead(l, h); $('q1').scrollIntoView(); }
    });
    return el('figure', null, canvas, el('figcaption', { text: col.replace('importance_', '') }));
  }
  function renderQ3() {
    var imp = $('importance');
    if (D.importance_columns.length) {
      var g = el('div', { cls: 'mini-grids' });
      D.importance_columns.forEach(function (c) { g.appendChild(miniGrid(c)); });
      imp.appendChild(el('p', { cls: 'hint', text: 'Rank per criterion (bright = more important; layers down, heads across). Click a head to open it above.' }));
      imp.appendChild(g);
    } else imp.appendChild(missing('importance'));
    var rc = $('rankcorr');
    if (D.rank_correlation) {
      var m = D.rank_correlation, t = el('table', { cls: 'data' }), tr = el('tr', null, el('th'));
      m.names.forEach(function (n) { tr.appendChild(el('th', { text: n })); });
      t.appendChild(tr);
      m.values.forEach(function (row, i) {
        var r = el('tr', null, el('th', { cls: 'txt', text: m.rows[i] }));
        row.forEach(function (v) {
          var c = typeof v === 'number' ? ramp(DIVERGE, (v + 1) / 2) : NONE;
          r.appendChild(el('td', { text: fmt(v), style: 'background:' + rgb(c) + ';color:' + inkFor(c) }));
        });
        t.appendChild(r);
      });
      rc.appendChild(t);
    } else rc.appendChild(missing('rank_correlation'));
    var pr = $('prune'), P = D.prune || {};
    if (P.curve) {
      if (P.curve.plot) pr.appendChild(el('img', { cls: 'plot', src: P.curve.plot, alt: 'pruning curve' }));
      pr.appendChild(collapsible('prune_curve.csv (' + P.curve.rows.length + ' rows)', table(P.curve.columns, P.curve.rows)));
    } else pr.appendChild(missing('prune_curve'));
    var rd = $('redundancy');
    if (P.redundancy) {
      if (P.redundancy.plot) rd.appendChild(el('img', { cls: 'plot', src: P.redundancy.plot, alt: 'redundancy per layer' }));
      rd.appendChild(collapsible('redundancy.csv', table(P.redundancy.columns, P.redundancy.rows)));
    } else rd.appendChild(missing('redundancy'));
    var sp = $('speedup');
    if (P.summary) {
      var keys = Object.keys(P.summary);
      sp.appendChild(table(['', 'value'], keys.map(function (k) { return [k, P.summary[k]]; })));
      if (P.details && Object.keys(P.details).length) sp.appendChild(collapsible('details', el('pre', { cls: 'json', text: JSON.stringify(P.details, null, 1) })));
    } else sp.appendChild(missing('prune_summary'));
  }

  // --- generic panels: sections that need no page code of their own (report/sources.py Part.panel) ----
  function renderPanels() {
    (D.panels || []).forEach(function (p) {
      var box = $(p.place + '-panels');
      if (!box) return;
      box.appendChild(el('h3', { text: p.title }));
      (p.text || []).forEach(function (s) { box.appendChild(richText(s)); });
      if (p.plot) box.appendChild(el('img', { cls: 'plot', src: p.plot, alt: p.title }));
      if (p.rows && p.rows.length) {
        var t = table(p.columns, p.rows);
        box.appendChild(p.rows.length > 12 ? collapsible(p.title + ' (' + p.rows.length + ' rows)', t) : t);
      } else if (p.note && p.na) box.appendChild(el('p', { cls: 'na', text: p.note }));
      else if (p.note) box.appendChild(el('p', { cls: 'missing' }, richText(p.note)));
    });
  }

  renderHeader();
  renderGrid();
  renderCensus();
  renderSyntax();
  renderSimilarity();
  renderQ2();
  renderQ3();
  renderPanels();
  var hint = $('head-detail');
  if (!selected && hint.childNodes.length === 0) {
    hint.appendChild(el('p', { cls: 'hint', text: 'Click a head in the grid to see its attention maps and role scores.' }));
  }
  document.body.setAttribute('data-ready', '1');
})();
