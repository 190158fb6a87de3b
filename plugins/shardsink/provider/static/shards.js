// The Shards page: vanilla JS over /shardsink/api (no build step). All text goes in via
// textContent (never innerHTML), so shard data cannot inject markup.
"use strict";
(function () {
  const params = new URLSearchParams(location.search);
  const api = new URL("../api/", location.href);
  const app = document.getElementById("app");
  let root = "/";

  function el(tag, attrs, ...kids) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === undefined || v === null) continue;
      if (k === "class") e.className = v; else e.setAttribute(k, v);
    }
    for (const k of kids.flat()) {
      if (k === undefined || k === null) continue;
      e.append(k instanceof Node ? k : document.createTextNode(String(k)));
    }
    return e;
  }
  function svgEl(tag, attrs, text) {
    const e = document.createElementNS("http://www.w3.org/2000/svg", tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
    if (text !== undefined) e.textContent = text;
    return e;
  }
  // ISO-8601 UTC ("...Z" or "...+00:00") → "YYYY-MM-DD HH:MM:SS UTC" (milliseconds dropped).
  const when = (iso) => (iso ? iso.replace("T", " ").replace(/(Z|\+00:00)$/, "").replace(/\.\d+$/, "") + " UTC" : "—");
  const frontier = (ms, iso, closed) => (closed ? "closed (∅)" : when(iso));
  function bytes(n) {
    if (n === undefined || n === null) return "—";
    const u = ["B", "KiB", "MiB", "GiB", "TiB"]; let i = 0; let x = n;
    while (x >= 1024 && i < u.length - 1) { x /= 1024; i++; }
    return (i ? x.toFixed(1) : x) + " " + u[i];
  }
  function duration(ms) {
    if (ms === undefined || ms === null) return "—";
    const h = ms / 3600000; return h >= 48 ? (h / 24).toFixed(h % 24 ? 1 : 0) + " days" : h + " h";
  }
  const shardLink = (s) => el("a", { href: "?shard=" + encodeURIComponent(s.id), "data-shard": s.id }, s.url);
  function runLink(c) {
    if (!c || !c.dag_id) return el("span", { class: "muted mono" }, c ? c.writer : "—");
    const href = root + "dags/" + encodeURIComponent(c.dag_id) + "/runs/" + encodeURIComponent(c.run_id);
    const a = el("a", { href, target: "_top", class: "dagrun mono", title: "open this DAG run in Airflow" },
      c.dag_id + " / " + c.run_id);
    a.addEventListener("click", (ev) => openInAirflow(ev, href));
    return a;
  }
  // Inside the Airflow UI the page is an iframe sandboxed WITHOUT allow-top-navigation, so a
  // target=_top link is blocked. The frame is same-origin: hand the path to the UI's router
  // (history.pushState + popstate on the top window), as a click inside the UI would.
  function openInAirflow(ev, href) {
    try {
      const top = window.top;
      if (top === window || top.location.origin !== location.origin) return;  // not embedded: plain link
      ev.preventDefault();
      top.history.pushState({}, "", href);
      top.dispatchEvent(new PopStateEvent("popstate", { state: {} }));
    } catch (e) { /* cross-origin top: fall back to the plain link */ }
  }
  async function getJSON(path) {
    const r = await fetch(new URL(path, api), { credentials: "same-origin", headers: { Accept: "application/json" } });
    const body = await r.json().catch(() => ({}));
    if (!r.ok) throw new Error((body && body.detail) || r.status + " " + r.statusText);
    return body;
  }
  function fail(e) { app.replaceChildren(el("div", { class: "err" }, String(e.message || e))); }

  async function list() {
    const dag = params.get("dag_id"), run = params.get("run_id");
    const q = dag && run ? "?dag_id=" + encodeURIComponent(dag) + "&run_id=" + encodeURIComponent(run) : "";
    const data = await getJSON("shards" + q); root = data.airflow_root || "/";
    const head = el("tr", {}, ["Shard", "Upper (UTC)", "Since (UTC)", "Seqno", "Batches", "Parts", "Bytes", "Retention",
      "Leases", "Awaiting GC", "Leaked", "Last commit (UTC)", "By DAG run"].map((h) => el("th", {}, h)));
    const utc = (iso) => when(iso).replace(" UTC", "");
    const rows = data.shards.map((s) => {
      if (s.error) return el("tr", {}, el("td", {}, shardLink(s)), el("td", { colspan: 12, class: "err" }, s.error));
      if (!s.exists) return el("tr", {}, el("td", {}, shardLink(s)), el("td", { colspan: 12, class: "muted" }, "not created yet"));
      const c = s.last_commit, leaked = tally(s, "leaked");
      return el("tr", { "data-shard-row": s.id },
        el("td", { class: "wrap" }, shardLink(s)), el("td", { class: "upper" }, s.closed ? "closed (∅)" : utc(s.upper_time)),
        el("td", {}, utc(s.since_time)), el("td", { class: "num" }, s.seqno), el("td", { class: "num" }, s.batches),
        el("td", { class: "num" }, s.parts), el("td", { class: "num" }, bytes(s.bytes)),
        el("td", {}, duration(s.retention_ms)), el("td", { class: "num" }, s.leases),
        el("td", { class: "num muted", "data-class": "retained" }, tally(s, "retained").count),
        el("td", { class: "num" + (leaked.count ? " warn" : ""), "data-class": "leaked" }, leaked.count),
        el("td", {}, utc(c.at)), el("td", { class: "wrap" }, runLink(c)));
    });
    const title = dag && run ? "Shards written by this DAG run" : "Shards";
    const sub = dag && run ? dag + " / " + run : "Every shard the DAGs write or read, and the ones configured in [shardsink] shard_urls.";
    app.className = "";
    app.replaceChildren(el("h1", {}, title), el("div", { class: "sub" }, sub),
      rows.length ? el("div", { class: "scroll" }, el("table", { id: "shards" }, el("thead", {}, head), el("tbody", {}, rows)))
        : el("p", { class: "muted" }, "No shards found."));
  }

  // waiting: descriptions staged at or ahead of the upper (a backfill's later intervals waiting
  // to append in order), drawn as a band ahead of the upper line, one rectangle each.
  function chart(commits, waiting) {
    // since = 0 means "never advanced": plotted only once it moves (else it would squash the upper line).
    const moved = commits.some((c) => c.shard_since > 0);
    const pts = commits.filter((c) => c.at).slice().sort((a, b) => a.seqno - b.seqno)
      .map((c) => ({ x: Date.parse(c.at), up: c.shard_upper, since: moved ? c.shard_since : null, c }));
    const W = 860, H = 260, L = 150, R = 20, T = 14, B = 40;
    const svg = svgEl("svg", { width: W, height: H, viewBox: `0 0 ${W} ${H}`, id: "frontier-chart", role: "img" });
    if (pts.length < 1) return svg;
    const xs = pts.map((p) => p.x);
    const ys = pts.flatMap((p) => [p.up, p.since]).concat(waiting.flatMap((w) => [w.lower, w.upper])).filter((v) => v !== null);
    let x0 = Math.min(...xs), x1 = Math.max(...xs); if (x1 === x0) { x0 -= 1000; x1 += 1000; }
    let y0 = Math.min(...ys), y1 = Math.max(...ys); if (y1 === y0) { y0 -= 3600000; y1 += 3600000; }
    const sx = (x) => L + ((x - x0) / (x1 - x0)) * (W - L - R), sy = (y) => H - B - ((y - y0) / (y1 - y0)) * (H - T - B);
    svg.append(svgEl("rect", { x: L, y: T, width: W - L - R, height: H - T - B, fill: "#fafcff", stroke: "#e2e8f0" }));
    for (let i = 0; i <= 4; i++) {
      const y = y0 + ((y1 - y0) * i) / 4;
      svg.append(svgEl("line", { x1: L, x2: W - R, y1: sy(y), y2: sy(y), stroke: "#edf2f7" }));
      svg.append(svgEl("text", { x: L - 6, y: sy(y) + 4, "text-anchor": "end" }, when(new Date(y).toISOString()).replace(" UTC", "").slice(0, 16)));
    }
    for (let i = 0; i <= 3; i++) {
      const x = x0 + ((x1 - x0) * i) / 3;
      svg.append(svgEl("text", { x: sx(x), y: H - B + 16, "text-anchor": i === 0 ? "start" : i === 3 ? "end" : "middle" },
        when(new Date(x).toISOString()).replace(" UTC", "").slice(5, 19)));
    }
    svg.append(svgEl("text", { x: (L + W - R) / 2, y: H - 6, "text-anchor": "middle" }, "commit time (UTC) →"));
    const step = (key, color, dash) => {
      let d = "", prev = null;
      for (const p of pts) {
        if (p[key] === null) continue;
        const X = sx(p.x), Y = sy(p[key]);
        d += prev === null ? `M${X},${Y}` : `H${X}V${Y}`; prev = Y;
      }
      const path = svgEl("path", { d, fill: "none", stroke: color, "stroke-width": 2, class: "series-" + key });
      if (dash) path.setAttribute("stroke-dasharray", dash);
      svg.append(path);
      for (const p of pts) if (p[key] !== null) {
        const dot = svgEl("circle", { cx: sx(p.x), cy: sy(p[key]), r: 3, fill: color });
        dot.append(svgEl("title", {}, `seqno ${p.c.seqno}: ${key} ${when(new Date(p[key]).toISOString())}`));
        svg.append(dot);
      }
    };
    step("since", "#dd6b20", "5 3"); step("up", "#017cee");
    const bx = Math.min(sx(pts[pts.length - 1].x), W - R - 24);
    for (const w of waiting) {
      const band = svgEl("rect", { x: bx, y: sy(w.upper), width: W - R - bx, height: Math.max(2, sy(w.lower) - sy(w.upper)),
        fill: "#805ad5", "fill-opacity": w.turn === "next" ? 0.35 : 0.18, stroke: "#805ad5", class: "staged-band",
        "data-desc": w.desc_id, "data-lower": w.lower, "data-upper": w.upper });
      band.append(svgEl("title", {}, `staged, ${w.turn === "next" ? "next to append" : "waiting its turn"}: ${w.desc_id} ` +
        `[${when(w.lower_time)}, ${when(w.upper_time)}), ${w.staged_slots}/${w.slots} slots`));
      svg.append(band);
    }
    return svg;
  }

  function waitingTable(waiting) {
    const head = el("tr", {}, ["Description", "Interval [lower, upper)", "Slots staged", "Turn"].map((h) => el("th", {}, h)));
    return el("table", { id: "staged-waiting" }, el("thead", {}, head), el("tbody", {}, waiting.map((w) =>
      el("tr", { class: "staged", "data-desc": w.desc_id },
        el("td", { class: "mono wrap" }, w.desc_id), el("td", { class: "mono" }, "[" + when(w.lower_time) + ", " + when(w.upper_time) + ")"),
        el("td", { class: "num" }, w.staged_slots + " / " + w.slots),
        el("td", {}, w.turn === "next" ? "next: its lower is the upper" : "waiting for the interval before")))));
  }

  function commitsTable(commits) {
    const head = el("tr", {}, ["Seqno", "Committed at", "Kind", "DAG run / writer", "Rows", "Batch [lower, upper)", "Upper after", "Since after", "Description"].map((h) => el("th", {}, h)));
    return el("table", { id: "commits" }, el("thead", {}, head), el("tbody", {}, commits.map((c) =>
      el("tr", { class: "commit", "data-seqno": c.seqno },
        el("td", { class: "num" }, c.seqno), el("td", {}, when(c.at)), el("td", {}, c.kind),
        el("td", { class: "wrap" }, runLink(c)), el("td", { class: "num" }, c.rows),
        el("td", { class: "mono" }, c.lower_time ? "[" + when(c.lower_time) + ", " + (c.upper === null ? "∅" : when(c.upper_time)) + ")" : c.what),
        el("td", {}, c.shard_upper === null ? "closed" : when(new Date(c.shard_upper).toISOString())),
        el("td", {}, when(new Date(c.shard_since).toISOString())), el("td", { class: "mono muted wrap" }, c.desc_id || "—")))));
  }

  // The schema history (the API gives it oldest first, as `shardsink schema --json`): newest first here.
  function schemaTable(history) {
    const head = el("tr", {}, ["Schema", "Made current at", "Seqno", "Shard upper then", "Columns (field id)"].map((h) => el("th", {}, h)));
    const last = history.length ? history[history.length - 1].id : null;
    return el("table", { id: "schema-history" }, el("thead", {}, head), el("tbody", {}, history.slice().reverse().map((e) =>
      el("tr", { class: "schema", "data-schema-id": e.id },
        el("td", {}, "schema " + e.id + (e.id === last ? " (current)" : "")),
        el("td", {}, e.at ? when(e.at) : e.seqno === 0 ? "creation" : "—"), el("td", { class: "num" }, e.seqno),
        el("td", {}, e.upper === null || e.upper === undefined ? "—" : when(new Date(e.upper).toISOString())),
        el("td", { class: "mono wrap" }, e.fields.map((f) => f.name + ": " + f.type + (f.nullable ? "" : " not null") + " (#" + f.id + ")").join(", "))))));
  }

  // A class's count and bytes (live, retained = "awaiting GC", in_flight, leaked: shardsink.core.census);
  // "—" when the shard's objects could not be classified (objects_error says why).
  function tally(s, cls) {
    const c = s.objects && s.objects.counts[cls];
    return c ? c : { count: "—", bytes: null, label: cls };
  }

  // Every object but the live ones, one row each: only leaks in red; awaiting GC with when GC may take it.
  function objectsTable(objects) {
    const head = el("tr", {}, ["Class", "Key", "Kind", "Bytes", "Age", "GC may delete it", "Why"].map((h) => el("th", {}, h)));
    const label = { retained: "awaiting GC", in_flight: "in flight", leaked: "leaked" };
    const age = (s) => (s >= 7200 ? (s / 3600).toFixed(1) + " h" : s >= 120 ? Math.round(s / 60) + " min" : Math.round(s) + " s");
    return el("table", { id: "objects" }, el("thead", {}, head), el("tbody", {}, objects.map((o) =>
      el("tr", { class: "object", "data-class": o.cls, "data-key": o.key },
        el("td", { class: o.cls === "leaked" ? "warn" : "muted" }, label[o.cls] || o.cls),
        el("td", { class: "mono wrap" }, o.key), el("td", {}, o.kind), el("td", { class: "num" }, bytes(o.bytes)),
        el("td", { class: "num" }, age(o.age_s)),
        el("td", {}, o.cls !== "retained" ? "—" : o.gc_after_time ? "from " + when(o.gc_after_time) : "not by time alone (see why)"),
        el("td", { class: "wrap" }, o.why)))));
  }

  function simpleTable(id, cols, rows, empty) {
    if (!rows.length) return el("p", { class: "muted", id }, empty);
    return el("table", { id }, el("thead", {}, el("tr", {}, cols.map(([h]) => el("th", {}, h)))),
      el("tbody", {}, rows.map((r) => el("tr", {}, cols.map(([, f]) => el("td", {}, f(r)))))));
  }

  async function preview(id, out, asOf) {
    out.replaceChildren(el("span", { class: "muted" }, "Reading the snapshot…"));
    try {
      const d = await getJSON("shards/" + encodeURIComponent(id) + "/snapshot" + (asOf !== null ? "?as_of=" + asOf : ""));
      const t = el("table", { id: "snapshot" }, el("thead", {}, el("tr", {}, d.columns.map((c) => el("th", {}, c)))),
        el("tbody", {}, d.rows.map((r) => el("tr", {}, r.map((v) => el("td", { class: "mono" }, v === null ? "null" : typeof v === "object" ? JSON.stringify(v) : v))))));
      out.replaceChildren(el("div", { class: "sub" }, `As of ${when(d.as_of_time)}: ${d.total_rows} distinct rows; showing the first ${d.rows.length} (_count = multiplicity).`), el("div", { class: "scroll" }, t));
    } catch (e) { out.replaceChildren(el("div", { class: "err" }, String(e.message || e))); }
  }

  async function detail(id) {
    const s = await getJSON("shards/" + encodeURIComponent(id)); root = s.airflow_root || "/";
    const back = el("a", { href: "./" }, "← all shards");
    app.className = "";
    if (!s.exists) { app.replaceChildren(back, el("h1", {}, s.url), el("p", { class: "muted" }, "This shard has not been created yet.")); return; }
    const waiting = s.staged_waiting || [];
    const card = (k, v, cls) => el("div", { class: "card" }, el("div", { class: "k" }, k), el("div", { class: "v " + (cls || "") }, v));
    const cards = el("div", { class: "cards" },
      card("upper", frontier(s.upper, s.upper_time, s.closed), "upper"), card("since", when(s.since_time)), card("seqno", s.seqno),
      card("batches", s.batches), card("parts", s.parts), card("rows", s.rows), card("bytes", bytes(s.bytes)),
      card("retention", duration(s.retention_ms)), card("live leases", s.leases));
    for (const [cls, style] of [["live", ""], ["retained", "muted"], ["in_flight", "muted"], ["leaked", tally(s, "leaked").count ? "warn" : "ok"]]) {
      const t = tally(s, cls);
      cards.append(el("div", { class: "card", "data-class": cls }, el("div", { class: "k" }, t.label + " objects"),
        el("div", { class: "v " + style }, t.count, t.bytes === null ? null : el("span", { class: "muted small" }, " " + bytes(t.bytes)))));
    }
    const objects = s.objects ? s.objects.objects : [];
    const about = s.objects
      ? `Judged at ${when(new Date(s.objects.now * 1000).toISOString())}, with GC's grace period of ${s.objects.grace_s} s. ` +
        "Live: the newest version references them. Awaiting GC: only older retained versions reference them (a reader " +
        "pinned to one may read them); GC deletes them once those versions leave the retained history: never delete them " +
        "by hand. In flight: a writer may still commit or delete them. Leaked: nothing references them and no fate keeps them."
      : null;
    const legend = el("div", { class: "legend muted" }, el("span", {}, el("i", { class: "sw", style: "background:#017cee" }), "upper (write frontier)"),
      el("span", {}, el("i", { class: "sw", style: "background:#dd6b20" }), "since (read frontier)" + (s.commits.some((c) => c.shard_since > 0) ? "" : ": not advanced yet (0)")),
      waiting.length ? el("span", {}, el("i", { class: "sw", style: "background:#805ad5;height:10px" }), "staged, waiting to append (ahead of the upper)") : null,
      s.history_complete ? null : el("span", {}, `last ${s.commits.length} commits`));
    const out = el("div", { id: "preview" });
    const input = el("input", { type: "datetime-local", step: "0.001", id: "as-of" });
    if (s.upper !== null) input.value = new Date(s.upper - 1).toISOString().slice(0, 23);
    const form = el("form", { class: "asof" }, el("label", { for: "as-of" }, "Snapshot as of (UTC)"), input, el("button", { type: "submit" }, "Show"));
    form.addEventListener("submit", (ev) => { ev.preventDefault(); const t = Date.parse(input.value + "Z"); preview(id, out, Number.isFinite(t) ? t : null); });
    app.replaceChildren(back, el("h1", {}, "Shard"), el("div", { class: "sub mono", id: "shard-url" }, s.url), cards,
      el("h2", {}, "Upper and since over time"), legend, el("div", { class: "scroll" }, chart(s.commits, waiting)),
      ...(waiting.length ? [el("h2", {}, "Staged, waiting to append"), el("div", { class: "sub" }, "Descriptions whose writes staged at or ahead of the upper: each appends when the upper reaches its lower (a backfill commits in order). Read now; one may have committed since."),
        el("div", { class: "scroll" }, waitingTable(waiting))] : []),
      el("h2", {}, "Commit log"), el("div", { class: "scroll" }, commitsTable(s.commits)),
      el("h2", {}, "Schema history"), el("div", { class: "scroll" }, schemaTable(s.schema_history || [])),
      el("h2", {}, "Live leases"), simpleTable("leases", [["Holder", (l) => l.holder], ["As of", (l) => when(l.as_of_time)], ["Acquired", (l) => when(l.acquired_at)], ["Expires", (l) => when(l.expires_at)]], s.lease_list, "No live leases."),
      el("h2", {}, "Objects awaiting GC, in flight or leaked"),
      s.objects_error ? el("div", { class: "err" }, s.objects_error) : el("div", { class: "sub" }, about),
      objects.length ? el("div", { class: "scroll" }, objectsTable(objects)) : el("p", { class: "muted", id: "objects" }, "Every object is live."),
      el("h2", {}, "Snapshot preview"), form, out);
    if (s.upper !== null && s.upper > s.since) preview(id, out, null);
    else out.replaceChildren(el("p", { class: "muted" }, "Nothing is readable yet (upper = since)."));
  }

  const id = params.get("shard");
  (id ? detail(id) : list()).catch(fail);
})();
