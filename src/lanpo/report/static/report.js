window.addEventListener("error", () => {
  document.body.dataset.errors = (+document.body.dataset.errors || 0) + 1;
});
const DATA = JSON.parse(document.getElementById("lanpo-data").textContent);
const COLORS = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#4b5563", "#ca8a04"];
const DASHES = ["", "6 3", "2 3", "10 3 2 3"];
const esc = (s) =>
  String(s ?? "").replace(
    /[&<>"']/g,
    (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c],
  );
const el = (tag, attrs, html) => {
  const e = document.createElement(tag);
  Object.assign(e, attrs || {});
  if (html !== undefined) e.innerHTML = html;
  return e;
};
const fmt = (v) =>
  v === null || v === undefined
    ? ""
    : typeof v === "number"
      ? Math.abs(v) >= 100
        ? v.toFixed(0)
        : Math.abs(v) >= 1
          ? v.toFixed(2)
          : v.toFixed(3)
      : esc(v);

// A point is [x, y] or [x, y, standard error]: a point with its error is drawn with its 95% interval (y ± 1.96 s.e.).
const Z95 = 1.96;
const lowOf = (p) => (p.length > 2 ? p[1] - Z95 * p[2] : p[1]);
const highOf = (p) => (p.length > 2 ? p[1] + Z95 * p[2] : p[1]);

// The y-range of a share (held-out mean@k): every interval inside it, and never narrower than the noise it shows,
// so that a change inside the intervals does not fill the chart: at least 4 times the widest half-interval and
// 0.2, inside [0, 1].
function shareRange(pts) {
  let [y0, y1] = [Math.min(...pts.map(lowOf)), Math.max(...pts.map(highOf))];
  const noise = Math.max(0, ...pts.map((p) => (p.length > 2 ? Z95 * p[2] : 0)));
  const span = Math.min(1, Math.max(0.2, 4 * noise, y1 - y0));
  const mid = (y0 + y1) / 2;
  y0 = Math.max(0, Math.min(mid - span / 2, 1 - span));
  return [y0, Math.min(1, y0 + span)];
}

function chart(title, series, empty, share) {
  const W = 440,
    H = 220,
    L = 46,
    R = 10,
    T = 10,
    B = 26;
  const pts = series.flatMap((s) => s.points);
  const card = el("div", { className: "card" });
  card.appendChild(el("h3", {}, esc(title)));
  if (!pts.length) {
    card.appendChild(el("div", { className: "muted" }, empty || "no data logged"));
    return card;
  }
  let [x0, x1] = [Math.min(...pts.map((p) => p[0])), Math.max(...pts.map((p) => p[0]))];
  let [y0, y1] = share ? shareRange(pts) : [Math.min(...pts.map(lowOf)), Math.max(...pts.map(highOf))];
  if (x0 === x1) {
    x0 -= 1;
    x1 += 1;
  }
  if (y0 === y1) {
    y0 -= 0.5;
    y1 += 0.5;
  }
  const sx = (x) => L + ((x - x0) / (x1 - x0)) * (W - L - R),
    sy = (y) => H - B - ((y - y0) / (y1 - y0)) * (H - T - B);
  let svg = `<svg viewBox="0 0 ${W} ${H}" width="100%" role="img" aria-label="${esc(title)}">`;
  for (let i = 0; i <= 4; i++) {
    const y = y0 + ((y1 - y0) * i) / 4;
    svg += `<line x1="${L}" x2="${W - R}" y1="${sy(y)}" y2="${sy(y)}" stroke="#eee"/>`;
    svg += `<text x="${L - 4}" y="${sy(y) + 4}" font-size="10" text-anchor="end" fill="#666">${fmt(y)}</text>`;
  }
  new Set([0, 1, 2, 3, 4].map((i) => Math.round(x0 + ((x1 - x0) * i) / 4))).forEach((x) => {
    // whole steps only
    if (x >= x0 && x <= x1)
      svg += `<text x="${sx(x)}" y="${H - 8}" font-size="10" text-anchor="middle" fill="#666">${x}</text>`;
  });
  series.forEach((s) => {
    const d = s.points.map((p, i) => `${i ? "L" : "M"}${sx(p[0]).toFixed(1)},${sy(p[1]).toFixed(1)}`).join("");
    svg += `<path d="${d}" fill="none" stroke="${s.color}" stroke-width="1.6" stroke-dasharray="${s.dash}"/>`;
    if (s.points.length < 40)
      s.points.forEach((p) => {
        const interval = p.length > 2 ? ` (95% interval ${fmt(lowOf(p))} to ${fmt(highOf(p))})` : "";
        if (p.length > 2) {
          const [x, lo, hi] = [sx(p[0]).toFixed(1), sy(lowOf(p)).toFixed(1), sy(highOf(p)).toFixed(1)];
          svg += `<path class="interval" d="M${x},${lo}L${x},${hi}M${+x - 3},${lo}h6M${+x - 3},${hi}h6" stroke="${s.color}" stroke-width="1" fill="none"/>`;
        }
        svg += `<circle cx="${sx(p[0])}" cy="${sy(p[1])}" r="2" fill="${s.color}"><title>${esc(s.label)} step ${p[0]}: ${fmt(p[1])}${interval}</title></circle>`;
      });
  });
  card.appendChild(el("div", {}, svg + "</svg>"));
  if (pts.some((p) => p.length > 2))
    card.appendChild(
      el(
        "div",
        { className: "muted" },
        "Bars: each evaluation's 95% interval (mean ± 1.96 s.e. over its problems). Two points whose bars overlap may differ by noise alone.",
      ),
    );
  card.appendChild(
    el(
      "div",
      { className: "legend" },
      series
        .map(
          (s) =>
            `<span style="color:${s.color}"><svg width="20" height="6"><line x1="0" x2="20" y1="3" y2="3" stroke="${s.color}" stroke-width="2" stroke-dasharray="${s.dash}"/></svg> ${esc(s.label)}</span>`,
        )
        .join(""),
    ),
  );
  return card;
}

// The evaluations in the run directories (lanpo eval --out RUN/eval-before, RUN/eval-after), as points at the step
// their model stands at (0 for the start model, the last step for RUN/final): one series per data set, mode and
// mean@k, shown where nothing was evaluated during training.
function runEvaluations() {
  const series = new Map();
  DATA.runs.forEach((run, r) => {
    run.evals.forEach((e) => {
      if (e.step === null || e.step === undefined) return;
      Object.entries(e.modes).forEach(([mode, metrics]) => {
        Object.entries(metrics).forEach(([key, value]) => {
          if (!/^mean@\d+$/.test(key) || typeof value !== "number") return;
          const label = (DATA.runs.length > 1 ? run.name + ": " : "") + `${e.data} ${mode} ${key} (lanpo eval)`;
          if (!series.has(label))
            series.set(label, {
              label,
              points: [],
              color: COLORS[series.size % COLORS.length],
              dash: DASHES[r % DASHES.length],
              logged: false,
            });
          const error = metrics[`${key}_stderr`];
          series.get(label).points.push(typeof error === "number" ? [e.step, value, error] : [e.step, value]);
        });
      });
    });
  });
  return [...series.values()].map((s) => ({ ...s, points: s.points.sort((a, b) => a[0] - b[0]) }));
}

function curves(main) {
  if (DATA.runs.length > 1)
    main.appendChild(
      el(
        "div",
        { className: "muted" },
        "Runs: " +
          DATA.runs.map((r, i) => `${esc(r.name)} (${DASHES[i % 4] ? "dash " + (i + 1) : "solid"})`).join(", "),
      ),
    );
  const grid = el("div", { className: "grid" });
  main.appendChild(grid);
  const evals = DATA.runs.reduce((n, run) => n + run.evals.length, 0); // evaluations in the run directories
  DATA.panels.forEach(([title, keys]) => {
    const series = [];
    DATA.runs.forEach((run, r) => {
      keys.forEach((k, i) => {
        if (run.metrics[k])
          series.push({
            label: (DATA.runs.length > 1 ? run.name + ": " : "") + k,
            points: run.metrics[k],
            color: COLORS[i % COLORS.length],
            dash: DASHES[r % DASHES.length],
            logged: true,
          });
      });
    });
    const heldOut = title.startsWith("Held-out");
    if (heldOut && !series.length) series.push(...runEvaluations()); // before/after evaluations, at their steps
    const empty =
      heldOut && evals
        ? `no evaluation during training (--eval_every N), and none of the ${evals} evaluation(s) in the run directory is of a model whose step is known: see the Evaluation tab`
        : "";
    const fromRunDir = heldOut && series.length && !series[0].logged;
    const name = fromRunDir ? `${title}: the run directory's evaluations` : title;
    grid.appendChild(chart(name, series, empty, heldOut));
  });
}

function pager(container, items, render, size) {
  let page = 0;
  const list = el("div"),
    nav = el("div", { className: "pager muted" });
  container.append(nav, list);
  function draw() {
    const pages = Math.max(1, Math.ceil(items.length / size));
    page = Math.min(page, pages - 1);
    list.innerHTML = "";
    items.slice(page * size, (page + 1) * size).forEach((x) => list.appendChild(render(x)));
    nav.innerHTML = `${items.length} shown &middot; page ${page + 1} of ${pages} `;
    const prev = el("button", {
      textContent: "previous",
      disabled: page === 0,
      onclick: () => {
        page--;
        draw();
      },
    });
    const next = el("button", {
      textContent: "next",
      disabled: page >= pages - 1,
      onclick: () => {
        page++;
        draw();
      },
    });
    nav.append(prev, next);
  }
  draw();
}

function entryCard(e) {
  const c = el("div", { className: "card entry" });
  const used = e.retrieved_by.length
    ? `<div class="muted">retrieved by ${e.retrieved_by.length} later prompt(s): ` +
      e.retrieved_by
        .slice(0, 12)
        .map((u) => `step ${u[0]} &middot; ${esc(u[1])} (relevance ${fmt(u[2])})`)
        .join("; ") +
      (e.retrieved_by.length > 12 ? " &hellip;" : "") +
      "</div>"
    : '<div class="muted">never retrieved (in the logged steps)</div>';
  c.innerHTML =
    `<h3>entry #${e.id} &middot; problem ${esc(e.problem_id)} &middot; step ${e.step}` +
    (e.correct === null
      ? ""
      : ` &middot; from a ${e.correct ? '<span class="ok">correct</span>' : '<span class="bad">wrong</span>'} trial`) +
    `</h3>` +
    `<div class="muted">${esc(e.problem)}</div><b>Flow of thought</b><pre>${esc(e.flow)}</pre>` +
    `<b>Principles</b><ul>${e.principles.map((p) => `<li>${esc(p)}</li>`).join("")}</ul>` +
    `<b>Pitfalls</b><ul>${e.pitfalls.map((p) => `<li>${esc(p)}</li>`).join("")}</ul>` +
    used;
  return c;
}

// The pool audit (lanpo pool audit's figures, golds aside): are the lessons transferable, repeated, answer-free;
// which of them helped (each credited entry's in-group lift with its 95% interval); how concentrated retrieval is.
function auditCard(audit, total) {
  const card = el("div", { className: "card pool-audit" });
  const s = audit && audit.summary;
  card.appendChild(el("h3", {}, "Audit"));
  if (!s || !s.entries) {
    card.appendChild(el("div", { className: "muted" }, "no entries to audit"));
    return card;
  }
  const pct = (v) => (v === null || v === undefined ? "—" : `${(100 * v).toFixed(1)}%`);
  const r = s.readings || {};
  const rows = [
    ["entries / problems / lessons", `${s.entries} / ${s.problems} / ${s.lessons}`],
    ["specificity (lessons repeating their problem's numbers or names)", pct(s.mean_specificity)],
    ["problem-specific entries (half their lessons or more)", pct(s.specific_entries)],
    ["lessons stating an answer or holding code", s.answers_stated],
    ["lessons repeated across problems", pct(s.repeated_lesson_share)],
    ["of them, general principles (naming an operation, quantity or check)", pct(s.repeated_general_share)],
    ["empty lessons (naming no operation, quantity or check)", pct(s.empty_lesson_share)],
    ["boilerplate entries (at least half their lessons empty)", pct(s.boilerplate_entries)],
    ["words per lesson / lessons per entry", `${fmt(s.words_per_lesson)} / ${fmt(s.lessons_per_entry)}`],
    ["entries shown / credited with lift", `${s.shown} / ${s.credited}`],
    ["mean lift of credited entries", fmt(s.mean_lift)],
    ["helped / hurt / unclear (95% interval)", `${r.helped || 0} / ${r.hurt || 0} / ${r.unclear || 0}`],
    ["retrievals taken by the top 10% of entries", `${pct(s.top10_share)} of ${s.retrievals}`],
  ];
  card.appendChild(
    el(
      "table",
      {},
      rows.map(([k, v]) => `<tr><td>${esc(k)}</td><td>${typeof v === "string" ? v : fmt(v)}</td></tr>`).join(""),
    ),
  );
  if (audit.audited < total)
    card.appendChild(el("div", { className: "note" }, `Audit of the newest ${audit.audited} of ${total} entries.`));
  const grid = el("div", { className: "grid" });
  const lifts = audit.lifts.map((v, i) => [i, v[0], v[1] ?? v[0], v[2] ?? v[0]]);
  grid.appendChild(
    chart(
      "Lift per credited entry, sorted (95% interval)",
      [
        { label: "mean lift", points: lifts.map((v) => [v[0], v[1]]), color: COLORS[0], dash: "" },
        { label: "low", points: lifts.map((v) => [v[0], v[2]]), color: COLORS[6], dash: "2 3" },
        { label: "high", points: lifts.map((v) => [v[0], v[3]]), color: COLORS[6], dash: "2 3" },
      ],
      "no entry credited with lift (the pool has no worth records, or nothing was shown)",
    ),
  );
  grid.appendChild(
    chart(
      "Retrievals (%) taken by the top entries (%)",
      [
        {
          label: "most retrieved first",
          points: audit.concentration.map((p) => [100 * p[0], 100 * p[1]]),
          color: COLORS[2],
          dash: "",
        },
      ],
      "no retrieval recorded",
    ),
  );
  card.appendChild(grid);
  if (audit.repeated.length)
    card.appendChild(
      el(
        "div",
        { className: "muted" },
        "Most repeated across problems: " +
          audit.repeated.map(([text, n]) => `&ldquo;${esc(text)}&rdquo; (${n} problems)`).join("; "),
      ),
    );
  return card;
}

function poolTab(main) {
  DATA.runs.forEach((run) => {
    const pool = run.pool,
      box = el("div", { className: "card" });
    main.appendChild(box);
    box.appendChild(
      el("h3", {}, `${esc(run.name)}: ${pool.total_entries} entries, ${pool.total_attempts} stored attempts`),
    );
    if (pool.total_entries > pool.entries.length)
      box.appendChild(
        el("div", { className: "note" }, `Showing the newest ${pool.entries.length} of ${pool.total_entries} entries.`),
      );
    if (pool.audit) box.appendChild(auditCard(pool.audit, pool.total_entries));
    const search = el("input", {
      type: "search",
      placeholder: "search entries (problem, flow, principles, pitfalls)",
      className: "pool-search",
      size: 50,
    });
    const by = el(
      "select",
      {},
      '<option value="entry">entries, newest first</option><option value="problem">by problem</option><option value="attempts">stored attempts</option>',
    );
    const out = el("div", { className: "pool-results" });
    box.append(search, by, out);
    const text = (e) => [e.problem, e.flow, ...e.principles, ...e.pitfalls, e.problem_id].join(" ").toLowerCase();
    function draw() {
      out.innerHTML = "";
      const q = search.value.trim().toLowerCase();
      if (by.value === "attempts") {
        const items = pool.attempts.filter((a) => !q || (a.text + " " + a.problem_id).toLowerCase().includes(q));
        pager(
          out,
          items,
          (a) =>
            el(
              "div",
              { className: "card" },
              `<h3>attempt at ${esc(a.problem_id)} &middot; step ${a.step}</h3><pre>${esc(a.text)}</pre>`,
            ),
          20,
        );
        return;
      }
      const items = pool.entries
        .filter((e) => !q || text(e).includes(q))
        .slice()
        .reverse();
      if (by.value === "problem") {
        const groups = {};
        items.forEach((e) => (groups[e.problem_id] = groups[e.problem_id] || []).push(e));
        pager(
          out,
          Object.entries(groups),
          ([pid, es]) => {
            const g = el("div", { className: "card" });
            g.appendChild(
              el(
                "h3",
                {},
                `problem ${esc(pid)}: ${es.length} entries, ${pool.attempts.filter((a) => a.problem_id === pid).length} stored attempts`,
              ),
            );
            es.forEach((e) => g.appendChild(entryCard(e)));
            return g;
          },
          10,
        );
      } else pager(out, items, entryCard, 25);
    }
    search.addEventListener("input", draw);
    by.addEventListener("change", draw);
    const hash = new URLSearchParams(location.hash.slice(1));
    if (hash.get("search")) search.value = hash.get("search");
    draw();
  });
}

function rolloutsTab(main) {
  DATA.runs.forEach((run) => {
    const box = el("div", { className: "card" });
    main.appendChild(box);
    box.appendChild(el("h3", {}, `${esc(run.name)}: ${run.total_groups} logged groups (log_samples)`));
    if (run.total_groups > run.groups.length)
      box.appendChild(
        el(
          "div",
          { className: "note" },
          `Showing ${run.groups.length} of ${run.total_groups} groups, evenly spread over the steps.`,
        ),
      );
    const kind = el(
      "select",
      {},
      ["any kind", "feedback", "reflection", "abstraction", "scratch", "fallback"]
        .map((k) => `<option>${k}</option>`)
        .join(""),
    );
    const reward = el(
      "select",
      {},
      ["any reward", "some correct", "none correct", "feedback beat scratch"]
        .map((k) => `<option>${k}</option>`)
        .join(""),
    );
    const out = el("div");
    box.append(kind, reward, out);
    const mean = (rows) => (rows.length ? rows.reduce((a, r) => a + (r.reward || 0), 0) / rows.length : null);
    function keep(g) {
      const k = kind.value,
        rw = reward.value,
        rows = g.rows;
      if (k === "feedback" && !rows.some((r) => r.feedback)) return false;
      if (["reflection", "abstraction"].includes(k) && !rows.some((r) => r.feedback && r.kind === k)) return false;
      if (k === "scratch" && !rows.some((r) => !r.feedback)) return false;
      if (k === "fallback" && !rows.some((r) => r.fallback)) return false;
      if (rw === "some correct" && !rows.some((r) => r.correct)) return false;
      if (rw === "none correct" && rows.some((r) => r.correct)) return false;
      if (rw === "feedback beat scratch") {
        const f = mean(rows.filter((r) => r.feedback)),
          s = mean(rows.filter((r) => !r.feedback));
        if (f === null || s === null || f <= s) return false;
      }
      return true;
    }
    function rowCard(r) {
      const label = r.feedback ? r.kind : r.fallback ? `scratch (planned ${r.kind}: ${r.fallback})` : "scratch";
      const hits = (r.retrieved || []).map((h) => `#${h.entry_id} (${fmt(h.relevance)})`).join(", ");
      return (
        `<div class="card"><span class="kind ${r.feedback ? r.kind : ""}">${esc(label)}</span> reward <b class="${r.correct ? "ok" : "bad"}">${fmt(r.reward)}</b>${hits ? " &middot; entries " + hits : ""}` +
        `<div class="row"><div><div class="muted">prompt</div><pre>${esc(r.prompt)}</pre></div><div><div class="muted">completion</div><pre>${esc(r.completion)}</pre></div></div></div>`
      );
    }
    function draw() {
      out.innerHTML = "";
      pager(
        out,
        run.groups.filter(keep).slice().reverse(),
        (g) => {
          const c = el("div", { className: "card group" });
          const fb = g.rows.filter((r) => r.feedback),
            sc = g.rows.filter((r) => !r.feedback);
          c.innerHTML =
            `<h3>step ${g.step} &middot; problem ${esc(g.problem_id)} &middot; gold ${esc(g.gold)} &middot; feedback mean ${fmt(mean(fb))} vs scratch mean ${fmt(mean(sc))}</h3><div class="muted">${esc(g.problem)}</div>` +
            `<div class="row"><div><b>with feedback</b>${fb.map(rowCard).join("") || '<div class="muted">none</div>'}</div><div><b>from scratch</b>${sc.map(rowCard).join("") || '<div class="muted">none</div>'}</div></div>`;
          return c;
        },
        10,
      );
    }
    kind.addEventListener("change", draw);
    reward.addEventListener("change", draw);
    draw();
  });
}

function evalTab(main) {
  DATA.runs.forEach((run) => {
    const box = el("div", { className: "card" });
    main.appendChild(box);
    box.appendChild(el("h3", {}, esc(run.name)));
    const keys = [...new Set(run.eval_table.flatMap((r) => Object.keys(r.cells)))].sort();
    if (keys.length) {
      let t =
        '<b>During training</b> <span class="muted">mean@k &plusmn; s.e. (pass@k)</span><table><tr><th>step</th>' +
        keys.map((k) => `<th>${esc(k)}</th>`).join("") +
        "</tr>";
      run.eval_table.forEach((r) => {
        t +=
          `<tr><td>${r.step}</td>` +
          keys
            .map((k) => {
              const c = r.cells[k];
              return `<td>${c ? fmt(c[0]) + (c[1] === null ? "" : " &plusmn; " + fmt(c[1])) + (c[2] === null ? "" : ` (${fmt(c[2])})`) : ""}</td>`;
            })
            .join("") +
          "</tr>";
      });
      box.appendChild(el("div", {}, t + "</table>"));
    }
    if (run.evals.length) {
      let t =
        "<b>Evaluations in the run directory</b><table><tr><th>evaluation</th><th>model</th><th>data</th><th>mode</th><th>k</th><th>mean@k</th><th>&plusmn; s.e.</th><th>pass@k</th><th>mean length</th></tr>";
      run.evals.forEach((e) =>
        Object.entries(e.modes).forEach(([mode, m]) => {
          t += `<tr><td>${esc(e.name)}</td><td>${esc(e.model)}</td><td>${esc(e.data)}</td><td>${esc(mode)}</td><td>${esc(e.k)}</td><td>${fmt(m["mean@" + e.k])}</td><td>${fmt(m["mean@" + e.k + "_stderr"])}</td><td>${fmt(m["pass@" + e.k])}</td><td>${fmt(m.mean_length)}</td></tr>`;
        }),
      );
      box.appendChild(el("div", {}, t + "</table>"));
    }
    if (!keys.length && !run.evals.length)
      box.appendChild(
        el(
          "div",
          { className: "muted" },
          "No evaluation: train with --eval_every N --eval_benchmarks ..., or run lanpo eval --out RUN/eval-NAME.",
        ),
      );
  });
}

function configTab(main) {
  DATA.runs.forEach((run) => {
    main.appendChild(
      el(
        "div",
        { className: "card" },
        `<h3>${esc(run.name)} &middot; ${esc(run.path)}</h3><pre>${esc(run.config || "no config.yaml")}</pre>`,
      ),
    );
  });
}

const TABS = { Curves: curves, Pool: poolTab, Rollouts: rolloutsTab, Evaluation: evalTab, Config: configTab };
function show(name) {
  const main = document.getElementById("main");
  main.innerHTML = "";
  document.querySelectorAll("#tabs button").forEach((b) => b.classList.toggle("on", b.textContent === name));
  TABS[name](main);
  document.body.dataset.tab = name;
}
Object.keys(TABS).forEach((name) =>
  document.getElementById("tabs").appendChild(el("button", { textContent: name, onclick: () => show(name) })),
);
show(new URLSearchParams(location.hash.slice(1)).get("tab") || "Curves");
