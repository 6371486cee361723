/* Diffract report: sortable tables and SVG charts drawn in the browser from the data the
   report embeds (no library, no network). A chart is an element with data-chart='{spec}';
   every chart is drawn when the page loads (about a millisecond each), so a screenshot or
   a printout holds them all.
   spec: {w, h, title, panels: [{title, xlabel, ylabel, xlog, ylog, cats, ylim,
          series: [{kind: points|line|bars|vline|hband, x, y, x0, x1, y0, y1, color, label,
                    dash, names}]}]}  (panels side by side; cats: category labels of x) */
(function () {
  "use strict";
  var NS = "http://www.w3.org/2000/svg";

  function el(tag, attrs, parent, text) {
    var e = document.createElementNS(NS, tag);
    for (var k in attrs) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = text;
    if (parent) parent.appendChild(e);
    return e;
  }

  function fmt(v, digits) {  /* ``digits`` significant ones (3 by default) */
    var p = digits || 3, a = Math.abs(v);
    if (v === 0) return "0";
    if (a >= 1e4 || a < 1e-3) {
      return v.toExponential(p - 1).replace(/\.?0+e/, "e").replace("e+", "e");
    }
    return String(Number(v.toPrecision(p)));
  }

  function labels(values) {  /* as many digits as the spacing needs, the same for all:
    every label differs from the others and reads as its value to within its spacing */
    var step = Infinity;
    for (var i = 1; i < values.length; i++) {
      var d = Math.abs(values[i] - values[i - 1]);
      if (d > 0) step = Math.min(step, d);
    }
    for (var p = 3; p <= 16; p++) {
      var out = values.map(function (v) { return fmt(v, p); });
      if (new Set(out).size === out.length && values.every(function (v, k) {
        return !isFinite(step) || Math.abs(Number(out[k]) - v) <= step * 1e-3; })) return out;
    }
    return values.map(String);
  }

  function linearTicks(lo, hi, count, whole) {
    var span = hi - lo || Math.abs(hi) || 1, raw = span / count;
    var step = Math.pow(10, Math.floor(Math.log10(raw)));
    var err = raw / step;
    step *= err >= 7.5 ? 10 : err >= 3.5 ? 5 : err >= 1.5 ? 2 : 1;
    if (whole) step = Math.max(1, Math.round(step));
    var out = [];
    for (var t = Math.ceil(lo / step) * step; t <= hi + step * 1e-9; t += step) {
      out.push(Math.abs(t) < step * 1e-9 ? 0 : t);
    }
    return out;
  }

  function logTicks(lo, hi) {
    var out = [], a = Math.floor(Math.log10(lo)), b = Math.ceil(Math.log10(hi));
    var each = b - a <= 2 ? [1, 2, 5] : [1];
    for (var e = a; e <= b; e++) {
      each.forEach(function (m) {
        var t = m * Math.pow(10, e);
        if (t >= lo * 0.999 && t <= hi * 1.001) out.push(t);
      });
    }
    return out;
  }

  function extent(panel, axis) {
    var lo = Infinity, hi = -Infinity, log = panel[axis + "log"];
    panel.series.forEach(function (s) {
      var vals = [];
      if (axis === "x") vals = s.kind === "bars" ? s.x0.concat(s.x1) : (s.x || []);
      else if (s.kind === "bars") vals = s.y.concat([0]);
      else if (s.kind === "hband") vals = [s.y0, s.y1];
      else if (s.kind !== "vline") vals = s.y || [];
      if (axis === "x" && s.kind === "vline") vals = [s.x];
      vals.forEach(function (v) {
        if (v === null || !isFinite(v) || (log && v <= 0)) return;
        if (v < lo) lo = v;
        if (v > hi) hi = v;
      });
    });
    if (axis === "y" && panel.ylim) {
      if (panel.ylim[0] !== null) lo = Math.min(lo, panel.ylim[0]);
      if (panel.ylim[1] !== null) hi = Math.max(hi, panel.ylim[1]);
    }
    var out;
    if (!isFinite(lo)) out = [log ? 1 : 0, log ? 10 : 1];
    else if (lo === hi) out = log ? [lo / 2, hi * 2] : [lo - 1, hi + 1];
    else if (log) out = [lo / Math.pow(hi / lo, 0.04), hi * Math.pow(hi / lo, 0.04)];
    else out = [lo - (hi - lo) * 0.05, hi + (hi - lo) * 0.05];
    var bound = axis === "y" && panel.ybound;  /* what the quantity can be (an overlap: 0..1) */
    if (bound) {
      if (bound[0] !== null) out[0] = Math.max(out[0], bound[0]);
      if (bound[1] !== null) out[1] = Math.min(out[1], bound[1]);
      if (!(out[0] < out[1])) out = [bound[0] !== null ? bound[0] : out[1] - 1,
                                     bound[1] !== null ? bound[1] : out[0] + 1];
    }
    return out;
  }

  function scale(domain, range, log) {
    var d0 = log ? Math.log10(domain[0]) : domain[0];
    var d1 = log ? Math.log10(domain[1]) : domain[1];
    return function (v) {
      var x = log ? Math.log10(v) : v;
      return range[0] + (x - d0) / (d1 - d0) * (range[1] - range[0]);
    };
  }

  function shorten(name, n) {  /* cut in the middle: the layer index and the leaf stay */
    if (name.length <= n) return name;
    var parts = name.split("."), at = -1;
    parts.forEach(function (q, i) { if (at < 0 && /^\d+$/.test(q)) at = i; });
    var head = at >= 0 && at < parts.length - 1 ? parts.slice(Math.max(0, at - 1), at + 1)
      .join(".") : "", tail = parts[parts.length - 1];
    for (var k = parts.length - 2; k > at; k--) {
      if (head.length + 1 + parts[k].length + 1 + tail.length > n) break;
      tail = parts[k] + "." + tail;
    }
    var cut = head ? head + "\u2026" + tail : "\u2026" + tail;
    return cut.length <= n ? cut : "\u2026" + name.slice(-(n - 1));
  }

  function shortAll(names, n) {  /* each shortened; those that would read alike keep the
    words the cut dropped after the layer index as initials (BERT's attention.output.dense
    beside output.dense: layer.0\u2026a.output.dense, layer.0\u2026output.dense) */
    var out = names.map(function (c) { return shorten(c, n); }), groups = {};
    out.forEach(function (t, i) { (groups[t] = groups[t] || []).push(i); });
    Object.keys(groups).forEach(function (t) {
      if (groups[t].length > 1) groups[t].forEach(function (i) {
        var cut = out[i], k = cut.indexOf("\u2026"), head = cut.slice(0, k),
            tail = cut.slice(k + 1), name = names[i];
        if (k < 0) return;
        var start = head ? name.indexOf(head) + head.length + 1 : 0,
            end = name.length - tail.length - 1;
        if (end <= start) return;
        var lost = name.slice(start, end).split(".").map(function (w) {
          return w.charAt(0); }).join(".");
        var longer = head + "\u2026" + lost + "." + tail;
        if (longer.length <= n) out[i] = longer;
      });
    });
    return out;
  }

  function colour(t) {  /* 0..1 -> a viridis-like ramp */
    var stops = [[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]];
    var x = Math.max(0, Math.min(1, t)) * (stops.length - 1), i = Math.min(3, Math.floor(x));
    var f = x - i, a = stops[i], b = stops[i + 1];
    return "rgb(" + a.map(function (v, k) { return Math.round(v + f * (b[k] - v)); }) + ")";
  }

  function heat(svg, p, left, top, width, height) {
    var rows = p.heat.rows, cols = p.heat.cols, z = p.heat.z, lo = Infinity, hi = -Infinity;
    z.forEach(function (r) { r.forEach(function (v) {
      if (v !== null && isFinite(v)) { lo = Math.min(lo, v); hi = Math.max(hi, v); } }); });
    var longest = 0, values = [];  /* the colour bar's scale: five values, ends included */
    rows.forEach(function (r) { longest = Math.max(longest, Math.min(r.length, 40)); });
    if (isFinite(lo)) {
      for (var t = 0; t <= (hi === lo ? 0 : 4); t++) values.push(lo + (hi - lo) * t / 4);
    }
    var scaleText = labels(values), widest = 0;
    scaleText.forEach(function (text) { widest = Math.max(widest, text.length); });
    /* room on the right for the bar and its widest label (it was cut at the edge) */
    var x0 = left + 10 + 5.6 * longest, x1 = left + width - 42 - 6.5 * widest, y0 = top + 24;
    var ch = Math.max(4, Math.min(18, (height - 60) / rows.length)), y1 = y0 + ch * rows.length;
    var cw = (x1 - x0) / cols.length, g = el("g", {}, svg);
    el("text", {x: (x0 + x1) / 2, y: top + 14, "text-anchor": "middle", "class": "ct"}, g,
       p.title || "");
    z.forEach(function (r, i) {
      var label = shorten(rows[i], 40);
      if (ch >= 8) el("text", {x: x0 - 4, y: y0 + ch * (i + 0.7), "text-anchor": "end",
                               "class": "tick"}, g, label);
      r.forEach(function (v, j) {
        var ok = v !== null && isFinite(v);
        var cell = el("rect", {x: x0 + cw * j, y: y0 + ch * i, width: cw + 0.3,
          height: ch + 0.3, fill: ok ? colour(hi > lo ? (v - lo) / (hi - lo) : 0.5) : "#eee"},
          g);
        el("title", {}, cell, rows[i] + " [" + (p.heat.axis || "head") + "=" + cols[j] +
           "]: " + (ok ? fmt(v) : "none"));
      });
    });
    var every = Math.max(1, Math.ceil(cols.length / 32));
    cols.forEach(function (c, j) {
      if (j % every === 0) el("text", {x: x0 + cw * (j + 0.5), y: y1 + 12,
        "text-anchor": "middle", "class": "tick"}, g, String(c));
    });
    el("text", {x: (x0 + x1) / 2, y: y1 + 28, "text-anchor": "middle", "class": "label"}, g,
       p.xlabel || "");
    for (var k = 0; k < 20; k++) {
      el("rect", {x: x1 + 16, y: y0 + (y1 - y0) * (19 - k) / 20, width: 12,
                  height: (y1 - y0) / 20 + 0.5, fill: colour(k / 19)}, g);
    }
    if (!isFinite(lo)) return;  /* nothing defined: the page says why, in words */
    scaleText.forEach(function (text, t) {
      var y = y1 - (y1 - y0) * t / 4;
      el("line", {x1: x1 + 28, x2: x1 + 31, y1: y, y2: y, stroke: "#555"}, g);
      el("text", {x: x1 + 33, y: y + 3, "class": "tick cbar"}, g, text);
    });
  }

  function occupied(p, X, Y, y0, y1, cats) {  /* pixels the data cover, every 6 or so */
    var out = [];
    p.series.forEach(function (s) {
      if (s.kind === "vline") {
        for (var q = y1; q < y0; q += 6) out.push([X(s.x), q]);
      } else if (s.kind === "bars") {
        s.y.forEach(function (v, i) {
          for (var q = Y(v); q < y0; q += 6) out.push([(X(s.x0[i]) + X(s.x1[i])) / 2, q]);
        });
      } else if (s.kind !== "hband") {
        var pts = [];
        (s.x || []).forEach(function (x, i) {
          var y = s.y[i];
          if (y !== null && isFinite(y) && !(p.ylog && y <= 0)) pts.push([cats ? X(i) : X(x),
                                                                           Y(y)]);
        });
        pts.forEach(function (q, i) {  /* a line's segments too */
          var r = pts[i + 1], n = s.kind === "line" && r ?
            Math.ceil(Math.hypot(r[0] - q[0], r[1] - q[1]) / 6) : 1;
          for (var k = 0; k < n; k++) out.push(r && n > 1 ? [q[0] + (r[0] - q[0]) * k / n,
                                                              q[1] + (r[1] - q[1]) * k / n] : q);
        });
      }
    });
    return out;
  }

  function panel(svg, p, left, top, width, height) {
    if (p.heat) return heat(svg, p, left, top, width, height);
    var cats = p.cats, longest = 0;
    (cats || []).forEach(function (c) { longest = Math.max(longest, Math.min(c.length, 24)); });
    var yd = extent(p, "y");
    var yt = p.ylog ? logTicks(yd[0], yd[1]) : linearTicks(yd[0], yd[1], 5, p.ywhole);
    var ytext = labels(yt), widest = 0;
    ytext.forEach(function (text) { widest = Math.max(widest, text.length); });
    /* the left margin makes room for the widest tick label beside the axis's own label */
    var m = {l: Math.max(58, 28 + 6 * widest), r: 12, t: 22,
             b: cats ? (p.room || 26 + 5.8 * longest) : 40};
    var x0 = left + m.l, x1 = left + width - m.r, y0 = top + height - m.b, y1 = top + m.t;
    var xd = cats ? [-0.5, cats.length - 0.5] : extent(p, "x");
    var X = scale(xd, [x0, x1], p.xlog && !cats), Y = scale(yd, [y0, y1], p.ylog);
    /* the legend: in the corner of the plot that holds no data, else above the plot */
    var legend = p.series.filter(function (s) { return s.label; }).map(function (s) {
      return [s.label, s.color || "#1f77b4", s.kind, s.dash || ""]; });
    var lw = 30 + 6 * Math.max.apply(null, legend.map(function (t) { return t[0].length; })
      .concat([0])), lh = 15 * legend.length + 4, place = null;
    if (legend.length) {
      var taken = occupied(p, X, Y, y0, y1, cats);
      [[x1, y1], [x0 + lw + 8, y1], [x1, y0 - lh], [x0 + lw + 8, y0 - lh]].forEach(function (c) {
        if (!place && !taken.some(function (q) { return q[0] >= c[0] - lw - 8 &&
            q[0] <= c[0] && q[1] >= c[1] && q[1] <= c[1] + lh; })) place = c;
      });
      if (!place) {  /* every corner holds data: the plot moves down to make room */
        y1 += lh;
        Y = scale(yd, [y0, y1], p.ylog);
        place = [x1, y1 - lh - 2];
      }
    }
    var g = el("g", {}, svg);
    el("text", {x: (x0 + x1) / 2, y: top + 14, "text-anchor": "middle", "class": "ct"}, g,
       p.title || "");
    yt.forEach(function (t, i) {
      var y = Y(t);
      el("line", {x1: x0, x2: x1, y1: y, y2: y, "class": "grid"}, g);
      el("text", {x: x0 - 5, y: y + 4, "text-anchor": "end", "class": "tick y"}, g,
         ytext[i]);
    });
    if (cats) {
      var every = Math.max(1, Math.ceil(cats.length / 40)), short = shortAll(cats, 24);
      cats.forEach(function (c, i) {
        if (i % every) return;
        var x = X(i) + 3, lab = el("text", {x: x, y: y0 + 8, "class": "tick",
          transform: "rotate(-90 " + x + " " + (y0 + 8) + ")", "text-anchor": "end"}, g,
          short[i]);
        el("title", {}, lab, c);
      });
    } else {
      var xt = p.xlog ? logTicks(xd[0], xd[1]) : linearTicks(xd[0], xd[1], 6, p.xwhole);
      var xtext = labels(xt);
      xt.forEach(function (t, i) {
        var x = X(t);
        el("line", {x1: x, x2: x, y1: y0, y2: y1, "class": "grid"}, g);
        el("text", {x: x, y: y0 + 15, "text-anchor": "middle", "class": "tick"}, g, xtext[i]);
      });
    }
    el("rect", {x: x0, y: y1, width: x1 - x0, height: y0 - y1, "class": "frame"}, g);
    el("text", {x: (x0 + x1) / 2, y: top + height - 4, "text-anchor": "middle",
                "class": "label"}, g, cats ? "" : p.xlabel || "");
    el("text", {x: left + 14, y: (y0 + y1) / 2, "text-anchor": "middle", "class": "label",
                transform: "rotate(-90 " + (left + 14) + " " + (y0 + y1) / 2 + ")"}, g,
       p.ylabel || "");
    var clip = "c" + Math.random().toString(36).slice(2);
    el("rect", {x: x0, y: y1, width: x1 - x0, height: y0 - y1},
       el("clipPath", {id: clip}, el("defs", {}, g)));
    var body = el("g", {"clip-path": "url(#" + clip + ")"}, g);
    p.series.forEach(function (s) {
      var color = s.color || "#1f77b4", xs = s.x || [], pts;
      if (s.kind === "hband") {
        el("rect", {x: x0, width: x1 - x0, y: Y(s.y1), height: Y(s.y0) - Y(s.y1),
                    fill: color, "fill-opacity": 0.09}, body);
      } else if (s.kind === "vline") {
        el("line", {x1: X(s.x), x2: X(s.x), y1: y0, y2: y1, stroke: color,
                    "stroke-dasharray": s.dash || "5,4", "stroke-width": 1.3}, body);
      } else if (s.kind === "bars") {
        s.y.forEach(function (v, i) {
          var a = X(s.x0[i]), b = X(s.x1[i]);
          el("rect", {x: a, width: Math.max(b - a - 0.5, 0.5), y: Y(v), height: y0 - Y(v),
                      fill: color, "fill-opacity": 0.55}, body);
        });
      } else {
        pts = [];
        xs.forEach(function (x, i) {
          var y = s.y[i];
          if (y === null || !isFinite(y) || (p.ylog && y <= 0)) return;
          pts.push([cats ? X(i) : X(x), Y(y), i]);
        });
        if (s.kind === "line") {
          el("polyline", {points: pts.map(function (q) { return q[0] + "," + q[1]; }).join(" "),
                          fill: "none", stroke: color, "stroke-width": s.width || 1.8,
                          "stroke-opacity": s.opacity || 1,
                          "stroke-dasharray": s.dash || ""}, body);
        }
        if (s.kind === "points" || s.marks) {
          pts.forEach(function (q) {
            var c = el("circle", {cx: q[0], cy: q[1], r: s.kind === "points" ? 3 : 2.4,
                                  fill: color}, body);
            var name = s.names ? s.names[q[2]] + ": " : "";
            el("title", {}, c, name + fmt(s.y[q[2]]));
          });
        }
      }
    });
    if (legend.length) el("g", {"class": "legend", "data-box": [place[0] - lw - 8, place[1],
      lw + 8, lh].join(",")}, g);
    legend.forEach(function (item, i) {
      var y = place[1] + 12 + 15 * i, x = place[0] - 8;
      el("text", {x: x - 22, y: y + 4, "text-anchor": "end", "class": "tick"}, g, item[0]);
      el("line", {x1: x - 18, x2: x, y1: y, y2: y, stroke: item[1], "stroke-width": 3,
                  "stroke-dasharray": item[2] === "vline" ? "4,3" : item[3]}, g);
    });
  }

  function draw(box) {
    var spec = JSON.parse(box.getAttribute("data-chart")), n = spec.panels.length;
    var w = spec.w || 520 * n, h = spec.h || 300;
    var svg = el("svg", {role: "img", "aria-label": spec.title || "chart"}, box);
    spec.panels.forEach(function (p) {  /* room for the longest category label: measured */
      if (p.cats) p.room = labelRoom(svg, p.cats);
      if (p.cats) h = Math.max(h, 22 + 140 + p.room);  /* the plot keeps 140 px */
    });
    svg.setAttribute("viewBox", "0 0 " + w + " " + h);
    svg.setAttribute("width", w);
    svg.setAttribute("height", h);
    spec.panels.forEach(function (p, i) { panel(svg, p, i * w / n, 0, w / n, h); });
  }

  function labelRoom(svg, cats) {  /* the bottom margin the rotated labels need */
    var widest = 0;
    shortAll(cats, 24).forEach(function (text) {
      var t = el("text", {"class": "tick", x: 0, y: -50}, svg, text);
      var width = t.getComputedTextLength ? t.getComputedTextLength() : 0;
      svg.removeChild(t);
      widest = Math.max(widest, width || 6.5 * text.length);
    });
    return 16 + widest;
  }

  function sortable(t) {
    t.querySelectorAll("th").forEach(function (th, i) {
      th.addEventListener("click", function () {
        var asc = !th.classList.contains("asc");
        t.querySelectorAll("th").forEach(function (h) { h.classList.remove("asc", "desc"); });
        th.classList.add(asc ? "asc" : "desc");
        var rows = Array.from(t.tBodies[0].rows);
        rows.sort(function (a, b) {
          var x = a.cells[i].dataset.v, y = b.cells[i].dataset.v;
          var p = parseFloat(x), q = parseFloat(y);
          if (!isNaN(p) && !isNaN(q)) return asc ? p - q : q - p;
          if (isNaN(p) !== isNaN(q)) return isNaN(p) ? 1 : -1;
          return asc ? String(x).localeCompare(y) : String(y).localeCompare(x);
        });
        rows.forEach(function (r) { t.tBodies[0].appendChild(r); });
      });
    });
  }

  document.querySelectorAll("table.sortable").forEach(sortable);
  document.querySelectorAll("[data-chart]").forEach(draw);
})();
