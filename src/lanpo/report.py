"""``lanpo report RUN [RUN ...]``: one self-contained HTML file per call (no CDN, no server; opens from disk).

Tabs: training curves (several runs overlaid), a pool browser (entries by problem, text search, which later
prompts retrieved each entry with what relevance, stored attempts), rollouts (each logged group: feedback prompts
beside their completions and rewards, next to the group's scratch rollouts; filters by kind and reward),
evaluation (during training and the run's ``eval-*`` directories) and the resolved config. Large runs stay usable:
at most :data:`MAX_ENTRIES` pool entries and :data:`MAX_GROUPS` rollout groups per run are embedded (the newest
entries; groups evenly spread over the steps), texts longer than :data:`MAX_TEXT` characters are cut (marked),
the page says when it cut, and lists paginate.
"""

from __future__ import annotations

import html
import json
import logging
from pathlib import Path

from .pool import POOL_FILENAME, ExperiencePool
from .runlog import read_jsonl, read_metrics, reward_is_accuracy

logger = logging.getLogger(__name__)

MAX_ENTRIES = 5000
MAX_GROUPS = 600
MAX_ATTEMPTS = 5000
MAX_TEXT = 4000  # characters of one prompt, completion or attempt kept in the page (the rest is marked as cut)

# (title, metric keys): one chart each; a key "a*b" takes every logged metric that starts with a and contains b
# (expanded in Python by :func:`panels`, so the page draws exactly the series listed).
PANELS = [
    ("Reward: feedback vs scratch", ["reward/feedback/mean", "reward/scratch/mean", "reward/reflection/mean",
                                     "reward/abstraction/mean"]),
    ("Accuracy: feedback vs scratch", ["accuracy/feedback/mean", "accuracy/scratch/mean", "accuracy/reflection/mean",
                                       "accuracy/abstraction/mean"]),
    ("Held-out evaluation (mean@k)", ["eval/*/mean@"]),
    ("KL to the reference", ["kl"]),
    ("Entropy", ["entropy"]),
    ("Completion length (tokens)", ["completions/mean_length"]),
    ("Truncated completions", ["completions/clipped_ratio"]),
    ("p_t planned vs realized", ["lanpo/feedback_ratio", "lanpo/feedback_share"]),
    ("Fallback share (planned feedback, plain prompt)", ["lanpo/fallback_share"]),
    ("Summary parse rate", ["summaries/parse_rate"]),
    ("Pool entries", ["lanpo/pool_size"]),
    ("Retrieval", ["retrieval/hit_rate", "retrieval/relevance_pass_rate"]),
    ("Strip weight (feedback tokens)", ["lanpo/strip_weight_mean", "lanpo/strip_weight_clipped"]),
    ("Time per phase (s)", ["time/generate", "time/summarize", "time/retrieve", "time/reward", "time/score",
                            "time/update", "eval/seconds"]),
]


def _metrics(rows: list[dict]) -> dict[str, list[list[float]]]:
    """metric → [[step, value], ...], numeric values only; eval rows keep only the point metrics."""
    out: dict[str, list[list[float]]] = {}
    for row in rows:
        step = row.get("step")
        if not isinstance(step, int | float):
            continue
        for key, value in row.items():
            if isinstance(value, int | float) and not isinstance(value, bool) and key != "step" and \
                    not (key.startswith("eval/") and ("stderr" in key or "pass@" in key)):
                out.setdefault(key, []).append([step, value])
    return out


def _eval_table(rows: list[dict]) -> list[dict]:
    """Evaluation during training by step: {"step", "cells": {"<benchmark>/<mode>/mean@k": [mean, s.e., pass@k]}}."""
    table = []
    for row in rows:
        cells = {key[5:]: [row[key], row.get(f"{key}_stderr"), row.get(key.replace("/mean@", "/pass@"))]
                 for key in row if key.startswith("eval/") and "/mean@" in key and not key.endswith("_stderr")}
        if cells:
            table.append({"step": row.get("step"), "cells": cells})
    return table


def _cut(text) -> str:
    text = str(text or "")
    return text if len(text) <= MAX_TEXT else text[:MAX_TEXT] + f" [... {len(text) - MAX_TEXT} more characters]"


def _groups(samples: list[dict]) -> tuple[list[dict], int]:
    """Logged rollouts as groups (step, group) in order, evenly thinned to MAX_GROUPS; and how many there were."""
    groups: dict[tuple, dict] = {}
    for i, row in enumerate(samples):
        key = (row.get("step"), row.get("group", i))
        group = groups.setdefault(key, {"step": row.get("step"), "problem": row.get("problem", ""),
                                        "problem_id": row.get("problem_id"), "gold": row.get("gold"), "rows": []})
        group["rows"].append({**{k: row.get(k) for k in ("kind", "feedback", "fallback", "reward", "correct",
                                                          "retrieved")},
                              "prompt": _cut(row.get("prompt")), "completion": _cut(row.get("completion"))})
    ordered = list(groups.values())
    if len(ordered) > MAX_GROUPS:
        stride = len(ordered) / MAX_GROUPS
        ordered = [ordered[int(i * stride)] for i in range(MAX_GROUPS)]
    return ordered, len(groups)


def _pool(run_dir: Path, groups: list[dict], retrievals: list[dict]) -> dict:
    path = run_dir / POOL_FILENAME
    if not path.is_file():
        return {"entries": [], "attempts": [], "total_entries": 0, "total_attempts": 0}
    with ExperiencePool(path, readonly=True) as pool:
        stats = pool.stats()
        entries = pool.entries(limit=MAX_ENTRIES, newest=True)
        attempts = pool.attempts(None, limit=MAX_ATTEMPTS)
    used: dict[int, list] = {}  # entry id → [step, problem_id, relevance] of the prompts that retrieved it
    for record in retrievals:
        for hit in record.get("retrieved") or []:
            used.setdefault(hit.get("entry_id"), []).append([record.get("step"), record.get("problem_id"),
                                                             hit.get("relevance")])
    if not retrievals:  # older runs: only the logged samples say what was retrieved
        for group in groups:
            for row in group["rows"]:
                for hit in row.get("retrieved") or []:
                    used.setdefault(hit.get("entry_id"), []).append([group["step"], group["problem_id"],
                                                                     hit.get("relevance")])
    return {
        "entries": [{"id": e.id, "problem_id": e.problem_id, "problem": e.problem, "flow": e.flow_of_thought,
                     "principles": e.principles, "pitfalls": e.pitfalls, "step": e.step, "correct": e.correct,
                     "reward": e.reward, "retrieved_by": used.get(e.id, [])} for e in entries],
        "attempts": [{"problem_id": a.problem_id, "text": _cut(a.text), "step": a.step} for a in attempts],
        "total_entries": stats["entries"], "total_attempts": stats["attempts"],
    }


def _evals(run_dir: Path) -> list[dict]:
    """Every ``results.json`` under the run (``eval-before``, ``eval-after``, ...) in the order they were written:
    name, data, modes' metrics."""
    found = []
    paths = [*run_dir.glob("*/results.json"), *run_dir.glob("*/*/results.json")]
    for path in sorted(paths, key=lambda p: (p.stat().st_mtime, str(p))):
        try:
            payload = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if isinstance(payload, dict) and isinstance(payload.get("modes"), dict):
            found.append({"name": str(path.parent.relative_to(run_dir)), "model": payload.get("model"),
                          "data": payload.get("data"), "k": (payload.get("settings") or {}).get("k"),
                          "modes": {m: v.get("metrics", {}) for m, v in payload["modes"].items()}})
    return found


def collect(run_dir: str | Path) -> dict:
    """Everything the report shows about one run, as plain JSON-able data."""
    run = Path(run_dir)
    metrics = read_metrics(run)  # a directory without metrics.jsonl is no run: a clear error
    groups, total_groups = _groups(read_jsonl(run / "samples.jsonl"))
    config = next((f.read_text() for f in (run / "config.yaml", run / "config.json") if f.is_file()), "")
    return {"name": run.name, "path": str(run), "metrics": _metrics(metrics),
            "reward_is_accuracy": reward_is_accuracy(metrics), "eval_table": _eval_table(metrics),
            "groups": groups, "total_groups": total_groups,
            "pool": _pool(run, groups, read_jsonl(run / "retrievals.jsonl")), "evals": _evals(run), "config": config}


def _expand(keys: list[str], logged: set[str]) -> list[str]:
    out = []
    for key in keys:
        head, star, tail = key.partition("*")
        out += sorted(m for m in logged if m.startswith(head) and tail in m[len(head):]) if star else [key]
    return out


def panels(runs: list[dict]) -> list:
    """PANELS with their patterns expanded over the runs' metrics; reward and accuracy in one chart when every
    run's reward is its accuracy (0/1 rewards)."""
    logged = {name for run in runs for name in run["metrics"]}
    merged = bool(runs) and all(r.get("reward_is_accuracy") for r in runs)
    out = []
    for title, keys in PANELS:
        if merged and title.startswith("Accuracy"):
            continue
        if merged and title.startswith("Reward"):
            title = "Reward = accuracy (0/1 verifier reward): feedback vs scratch"
        out.append((title, _expand(keys, logged)))
    return out


def render(runs: list[dict], title: str = "lanpo report") -> str:
    data = json.dumps({"runs": runs, "panels": panels(runs), "limits": {"entries": MAX_ENTRIES, "groups": MAX_GROUPS}},
                      ensure_ascii=False).replace("</", "<\\/")  # no "</script>" inside the data block
    return (_TEMPLATE.replace("__TITLE__", html.escape(title)).replace("__CSS__", _CSS)
            .replace("__DATA__", data).replace("__JS__", _JS))


def write_report(run_dirs: list[str | Path], out: str | Path | None = None) -> Path:
    runs = [collect(r) for r in run_dirs]
    empty = [str(d) for d, r in zip(run_dirs, runs) if not any(r["metrics"].values())]
    if empty:
        raise ValueError(f"{', '.join(empty)}: metrics.jsonl holds no step yet, so there is nothing to report "
                         "(a run logs its first step after its first optimizer step).")
    out = Path(out) if out else Path(run_dirs[0]) / "report.html"
    title = "lanpo report: " + ", ".join(r["name"] for r in runs)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(render(runs, title), encoding="utf-8")
    tmp.replace(out)
    return out


def serve(path: Path, port: int = 8000) -> None:
    """Serve the report's folder on localhost (Ctrl-C stops)."""
    import functools
    import http.server

    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(path.parent))
    with http.server.ThreadingHTTPServer(("127.0.0.1", port), handler) as server:
        print(f"Serving http://127.0.0.1:{server.server_address[1]}/{path.name} (Ctrl-C stops)", flush=True)
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass


_TEMPLATE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>__TITLE__</title>
<meta name="viewport" content="width=device-width, initial-scale=1"><style>__CSS__</style></head>
<body><header><h1>__TITLE__</h1><nav id="tabs"></nav></header><main id="main"></main>
<script type="application/json" id="lanpo-data">__DATA__</script>
<script>__JS__</script></body></html>
"""

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:0;color:#1d2330;background:#f6f7f9}
header{background:#1d2330;color:#fff;padding:10px 20px}h1{font-size:18px;margin:0 0 8px}
nav button{background:none;border:0;color:#cdd3df;font-size:14px;padding:6px 12px;cursor:pointer}
nav button.on{color:#fff;border-bottom:2px solid #6aa9ff}main{padding:16px 20px}
.grid{display:grid;grid-template-columns:repeat(auto-fill,minmax(440px,1fr));gap:14px}
.card{background:#fff;border:1px solid #dde1e8;border-radius:6px;padding:10px 12px;margin-bottom:12px}
.card h3{font-size:14px;margin:0 0 6px}.legend{font-size:11px;color:#555}.legend span{margin-right:10px}
.muted{color:#6b7280;font-size:12px}.note{background:#fff8e1;border:1px solid #f0d98c;padding:6px 10px;
border-radius:4px;font-size:13px;margin-bottom:10px}input,select{font-size:14px;padding:4px 6px;margin-right:8px}
pre{white-space:pre-wrap;word-break:break-word;font-size:12px;background:#f3f4f6;padding:6px;border-radius:4px;
max-height:320px;overflow:auto;margin:4px 0}table{border-collapse:collapse;font-size:13px;background:#fff}
td,th{border:1px solid #dde1e8;padding:4px 8px;text-align:left}.row{display:grid;grid-template-columns:1fr 1fr;
gap:10px}.kind{display:inline-block;font-size:11px;padding:1px 6px;border-radius:8px;background:#e5e7eb}
.kind.reflection{background:#dbeafe}.kind.abstraction{background:#ede9fe}.ok{color:#15803d}.bad{color:#b91c1c}
.pager button{margin:0 4px}ul{margin:4px 0 4px 18px;padding:0}
"""

_JS = r"""
window.addEventListener('error', () => { document.body.dataset.errors = (+document.body.dataset.errors || 0) + 1; });
const DATA = JSON.parse(document.getElementById('lanpo-data').textContent);
const COLORS = ['#2563eb','#dc2626','#16a34a','#9333ea','#ea580c','#0891b2','#4b5563','#ca8a04'];
const DASHES = ['', '6 3', '2 3', '10 3 2 3'];
const esc = s => String(s ?? '').replace(/[&<>"']/g, c => ({'&':'&amp;','<':'&lt;','>':'&gt;','"':'&quot;',"'":'&#39;'}[c]));
const el = (tag, attrs, html) => { const e = document.createElement(tag); Object.assign(e, attrs || {}); if (html !== undefined) e.innerHTML = html; return e; };
const fmt = v => v === null || v === undefined ? '' : (typeof v === 'number' ? (Math.abs(v) >= 100 ? v.toFixed(0) : Math.abs(v) >= 1 ? v.toFixed(2) : v.toFixed(3)) : esc(v));

function chart(title, series, empty) {
  const W = 440, H = 220, L = 46, R = 10, T = 10, B = 26;
  const pts = series.flatMap(s => s.points);
  const card = el('div', {className: 'card'}); card.appendChild(el('h3', {}, esc(title)));
  if (!pts.length) { card.appendChild(el('div', {className: 'muted'}, empty || 'no data logged')); return card; }
  let [x0, x1] = [Math.min(...pts.map(p => p[0])), Math.max(...pts.map(p => p[0]))];
  let [y0, y1] = [Math.min(...pts.map(p => p[1])), Math.max(...pts.map(p => p[1]))];
  if (x0 === x1) { x0 -= 1; x1 += 1; } if (y0 === y1) { y0 -= 0.5; y1 += 0.5; }
  const sx = x => L + (x - x0) / (x1 - x0) * (W - L - R), sy = y => H - B - (y - y0) / (y1 - y0) * (H - T - B);
  let svg = `<svg viewBox="0 0 ${W} ${H}" width="100%" role="img" aria-label="${esc(title)}">`;
  for (let i = 0; i <= 4; i++) {
    const y = y0 + (y1 - y0) * i / 4;
    svg += `<line x1="${L}" x2="${W - R}" y1="${sy(y)}" y2="${sy(y)}" stroke="#eee"/>`;
    svg += `<text x="${L - 4}" y="${sy(y) + 4}" font-size="10" text-anchor="end" fill="#666">${fmt(y)}</text>`;
  }
  new Set([0, 1, 2, 3, 4].map(i => Math.round(x0 + (x1 - x0) * i / 4))).forEach(x => {  // whole steps only
    if (x >= x0 && x <= x1) svg += `<text x="${sx(x)}" y="${H - 8}" font-size="10" text-anchor="middle" fill="#666">${x}</text>`;
  });
  series.forEach(s => {
    const d = s.points.map((p, i) => `${i ? 'L' : 'M'}${sx(p[0]).toFixed(1)},${sy(p[1]).toFixed(1)}`).join('');
    svg += `<path d="${d}" fill="none" stroke="${s.color}" stroke-width="1.6" stroke-dasharray="${s.dash}"/>`;
    if (s.points.length < 40) s.points.forEach(p => { svg += `<circle cx="${sx(p[0])}" cy="${sy(p[1])}" r="2" fill="${s.color}"><title>${esc(s.label)} step ${p[0]}: ${fmt(p[1])}</title></circle>`; });
  });
  card.appendChild(el('div', {}, svg + '</svg>'));
  card.appendChild(el('div', {className: 'legend'}, series.map(s => `<span style="color:${s.color}"><svg width="20" height="6"><line x1="0" x2="20" y1="3" y2="3" stroke="${s.color}" stroke-width="2" stroke-dasharray="${s.dash}"/></svg> ${esc(s.label)}</span>`).join('')));
  return card;
}

function curves(main) {
  if (DATA.runs.length > 1) main.appendChild(el('div', {className: 'muted'}, 'Runs: ' + DATA.runs.map((r, i) => `${esc(r.name)} (${DASHES[i % 4] ? 'dash ' + (i + 1) : 'solid'})`).join(', ')));
  const grid = el('div', {className: 'grid'}); main.appendChild(grid);
  const evals = DATA.runs.reduce((n, run) => n + run.evals.length, 0);  // evaluations in the run directories
  DATA.panels.forEach(([title, keys]) => {
    const series = [];
    DATA.runs.forEach((run, r) => {
      keys.forEach((k, i) => { if (run.metrics[k]) series.push({label: (DATA.runs.length > 1 ? run.name + ': ' : '') + k, points: run.metrics[k], color: COLORS[i % COLORS.length], dash: DASHES[r % DASHES.length]}); });
    });
    const empty = title.startsWith('Held-out') && evals ? `no evaluation during training (--eval_every N); ${evals} evaluation(s) in the run directory: see the Evaluation tab` : '';
    grid.appendChild(chart(title, series, empty));
  });
}

function pager(container, items, render, size) {
  let page = 0;
  const list = el('div'), nav = el('div', {className: 'pager muted'});
  container.append(nav, list);
  function draw() {
    const pages = Math.max(1, Math.ceil(items.length / size)); page = Math.min(page, pages - 1);
    list.innerHTML = ''; items.slice(page * size, (page + 1) * size).forEach(x => list.appendChild(render(x)));
    nav.innerHTML = `${items.length} shown &middot; page ${page + 1} of ${pages} `;
    const prev = el('button', {textContent: 'previous', disabled: page === 0, onclick: () => { page--; draw(); }});
    const next = el('button', {textContent: 'next', disabled: page >= pages - 1, onclick: () => { page++; draw(); }});
    nav.append(prev, next);
  }
  draw();
}

function entryCard(e) {
  const c = el('div', {className: 'card entry'});
  const used = e.retrieved_by.length ? `<div class="muted">retrieved by ${e.retrieved_by.length} later prompt(s): ` + e.retrieved_by.slice(0, 12).map(u => `step ${u[0]} &middot; ${esc(u[1])} (relevance ${fmt(u[2])})`).join('; ') + (e.retrieved_by.length > 12 ? ' &hellip;' : '') + '</div>' : '<div class="muted">never retrieved (in the logged steps)</div>';
  c.innerHTML = `<h3>entry #${e.id} &middot; problem ${esc(e.problem_id)} &middot; step ${e.step}` + (e.correct === null ? '' : ` &middot; from a ${e.correct ? '<span class="ok">correct</span>' : '<span class="bad">wrong</span>'} trial`) + `</h3>` +
    `<div class="muted">${esc(e.problem)}</div><b>Flow of thought</b><pre>${esc(e.flow)}</pre>` +
    `<b>Principles</b><ul>${e.principles.map(p => `<li>${esc(p)}</li>`).join('')}</ul>` +
    `<b>Pitfalls</b><ul>${e.pitfalls.map(p => `<li>${esc(p)}</li>`).join('')}</ul>` + used;
  return c;
}

function poolTab(main) {
  DATA.runs.forEach(run => {
    const pool = run.pool, box = el('div', {className: 'card'});
    main.appendChild(box);
    box.appendChild(el('h3', {}, `${esc(run.name)}: ${pool.total_entries} entries, ${pool.total_attempts} stored attempts`));
    if (pool.total_entries > pool.entries.length) box.appendChild(el('div', {className: 'note'}, `Showing the newest ${pool.entries.length} of ${pool.total_entries} entries.`));
    const search = el('input', {type: 'search', placeholder: 'search entries (problem, flow, principles, pitfalls)', className: 'pool-search', size: 50});
    const by = el('select', {}, '<option value="entry">entries, newest first</option><option value="problem">by problem</option><option value="attempts">stored attempts</option>');
    const out = el('div', {className: 'pool-results'});
    box.append(search, by, out);
    const text = e => [e.problem, e.flow, ...e.principles, ...e.pitfalls, e.problem_id].join(' ').toLowerCase();
    function draw() {
      out.innerHTML = '';
      const q = search.value.trim().toLowerCase();
      if (by.value === 'attempts') {
        const items = pool.attempts.filter(a => !q || (a.text + ' ' + a.problem_id).toLowerCase().includes(q));
        pager(out, items, a => el('div', {className: 'card'}, `<h3>attempt at ${esc(a.problem_id)} &middot; step ${a.step}</h3><pre>${esc(a.text)}</pre>`), 20);
        return;
      }
      const items = pool.entries.filter(e => !q || text(e).includes(q)).slice().reverse();
      if (by.value === 'problem') {
        const groups = {}; items.forEach(e => (groups[e.problem_id] = groups[e.problem_id] || []).push(e));
        pager(out, Object.entries(groups), ([pid, es]) => { const g = el('div', {className: 'card'}); g.appendChild(el('h3', {}, `problem ${esc(pid)}: ${es.length} entries, ${pool.attempts.filter(a => a.problem_id === pid).length} stored attempts`)); es.forEach(e => g.appendChild(entryCard(e))); return g; }, 10);
      } else pager(out, items, entryCard, 25);
    }
    search.addEventListener('input', draw); by.addEventListener('change', draw);
    const hash = new URLSearchParams(location.hash.slice(1)); if (hash.get('search')) search.value = hash.get('search');
    draw();
  });
}

function rolloutsTab(main) {
  DATA.runs.forEach(run => {
    const box = el('div', {className: 'card'}); main.appendChild(box);
    box.appendChild(el('h3', {}, `${esc(run.name)}: ${run.total_groups} logged groups (log_samples)`));
    if (run.total_groups > run.groups.length) box.appendChild(el('div', {className: 'note'}, `Showing ${run.groups.length} of ${run.total_groups} groups, evenly spread over the steps.`));
    const kind = el('select', {}, ['any kind', 'feedback', 'reflection', 'abstraction', 'scratch', 'fallback'].map(k => `<option>${k}</option>`).join(''));
    const reward = el('select', {}, ['any reward', 'some correct', 'none correct', 'feedback beat scratch'].map(k => `<option>${k}</option>`).join(''));
    const out = el('div'); box.append(kind, reward, out);
    const mean = rows => rows.length ? rows.reduce((a, r) => a + (r.reward || 0), 0) / rows.length : null;
    function keep(g) {
      const k = kind.value, rw = reward.value, rows = g.rows;
      if (k === 'feedback' && !rows.some(r => r.feedback)) return false;
      if (['reflection', 'abstraction'].includes(k) && !rows.some(r => r.feedback && r.kind === k)) return false;
      if (k === 'scratch' && !rows.some(r => !r.feedback)) return false;
      if (k === 'fallback' && !rows.some(r => r.fallback)) return false;
      if (rw === 'some correct' && !rows.some(r => r.correct)) return false;
      if (rw === 'none correct' && rows.some(r => r.correct)) return false;
      if (rw === 'feedback beat scratch') { const f = mean(rows.filter(r => r.feedback)), s = mean(rows.filter(r => !r.feedback)); if (f === null || s === null || f <= s) return false; }
      return true;
    }
    function rowCard(r) {
      const label = r.feedback ? r.kind : (r.fallback ? `scratch (planned ${r.kind}: ${r.fallback})` : 'scratch');
      const hits = (r.retrieved || []).map(h => `#${h.entry_id} (${fmt(h.relevance)})`).join(', ');
      return `<div class="card"><span class="kind ${r.feedback ? r.kind : ''}">${esc(label)}</span> reward <b class="${r.correct ? 'ok' : 'bad'}">${fmt(r.reward)}</b>${hits ? ' &middot; entries ' + hits : ''}` +
        `<div class="row"><div><div class="muted">prompt</div><pre>${esc(r.prompt)}</pre></div><div><div class="muted">completion</div><pre>${esc(r.completion)}</pre></div></div></div>`;
    }
    function draw() {
      out.innerHTML = '';
      pager(out, run.groups.filter(keep).slice().reverse(), g => {
        const c = el('div', {className: 'card group'});
        const fb = g.rows.filter(r => r.feedback), sc = g.rows.filter(r => !r.feedback);
        c.innerHTML = `<h3>step ${g.step} &middot; problem ${esc(g.problem_id)} &middot; gold ${esc(g.gold)} &middot; feedback mean ${fmt(mean(fb))} vs scratch mean ${fmt(mean(sc))}</h3><div class="muted">${esc(g.problem)}</div>` +
          `<div class="row"><div><b>with feedback</b>${fb.map(rowCard).join('') || '<div class="muted">none</div>'}</div><div><b>from scratch</b>${sc.map(rowCard).join('') || '<div class="muted">none</div>'}</div></div>`;
        return c;
      }, 10);
    }
    kind.addEventListener('change', draw); reward.addEventListener('change', draw); draw();
  });
}

function evalTab(main) {
  DATA.runs.forEach(run => {
    const box = el('div', {className: 'card'}); main.appendChild(box);
    box.appendChild(el('h3', {}, esc(run.name)));
    const keys = [...new Set(run.eval_table.flatMap(r => Object.keys(r.cells)))].sort();
    if (keys.length) {
      let t = '<b>During training</b> <span class="muted">mean@k &plusmn; s.e. (pass@k)</span><table><tr><th>step</th>' + keys.map(k => `<th>${esc(k)}</th>`).join('') + '</tr>';
      run.eval_table.forEach(r => { t += `<tr><td>${r.step}</td>` + keys.map(k => { const c = r.cells[k]; return `<td>${c ? fmt(c[0]) + (c[1] === null ? '' : ' &plusmn; ' + fmt(c[1])) + (c[2] === null ? '' : ` (${fmt(c[2])})`) : ''}</td>`; }).join('') + '</tr>'; });
      box.appendChild(el('div', {}, t + '</table>'));
    }
    if (run.evals.length) {
      let t = '<b>Evaluations in the run directory</b><table><tr><th>evaluation</th><th>model</th><th>data</th><th>mode</th><th>k</th><th>mean@k</th><th>&plusmn; s.e.</th><th>pass@k</th><th>mean length</th></tr>';
      run.evals.forEach(e => Object.entries(e.modes).forEach(([mode, m]) => { t += `<tr><td>${esc(e.name)}</td><td>${esc(e.model)}</td><td>${esc(e.data)}</td><td>${esc(mode)}</td><td>${esc(e.k)}</td><td>${fmt(m['mean@' + e.k])}</td><td>${fmt(m['mean@' + e.k + '_stderr'])}</td><td>${fmt(m['pass@' + e.k])}</td><td>${fmt(m.mean_length)}</td></tr>`; }));
      box.appendChild(el('div', {}, t + '</table>'));
    }
    if (!keys.length && !run.evals.length) box.appendChild(el('div', {className: 'muted'}, 'No evaluation: train with --eval_every N --eval_benchmarks ..., or run lanpo eval --out RUN/eval-NAME.'));
  });
}

function configTab(main) { DATA.runs.forEach(run => { main.appendChild(el('div', {className: 'card'}, `<h3>${esc(run.name)} &middot; ${esc(run.path)}</h3><pre>${esc(run.config || 'no config.yaml')}</pre>`)); }); }

const TABS = {Curves: curves, Pool: poolTab, Rollouts: rolloutsTab, Evaluation: evalTab, Config: configTab};
function show(name) {
  const main = document.getElementById('main'); main.innerHTML = '';
  document.querySelectorAll('#tabs button').forEach(b => b.classList.toggle('on', b.textContent === name));
  TABS[name](main); document.body.dataset.tab = name;
}
Object.keys(TABS).forEach(name => document.getElementById('tabs').appendChild(el('button', {textContent: name, onclick: () => show(name)})));
show(new URLSearchParams(location.hash.slice(1)).get('tab') || 'Curves');
"""
