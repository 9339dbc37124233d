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
import re
from importlib import resources
from pathlib import Path

from lanpo.pool.store import POOL_FILENAME, ExperiencePool
from lanpo.run.files import read_jsonl, read_metrics, reward_is_accuracy, write_text_atomic

logger = logging.getLogger(__name__)

MAX_ENTRIES = 5000
MAX_GROUPS = 600
MAX_ATTEMPTS = 5000
MAX_AUDIT = 100_000  # pool entries the audit section reads (the newest; the page says when it cut)
MAX_TEXT = 4000  # characters of one prompt, completion or attempt kept in the page (the rest is marked as cut)

# (title, metric keys): one chart each; a key "a*b" takes every logged metric that starts with a and contains b
# (expanded in Python by :func:`panels`, so the page draws exactly the series listed).
PANELS = [
    (
        "Reward: feedback vs scratch",
        ["reward/feedback/mean", "reward/scratch/mean", "reward/reflection/mean", "reward/abstraction/mean"],
    ),
    (
        "Accuracy: feedback vs scratch",
        ["accuracy/feedback/mean", "accuracy/scratch/mean", "accuracy/reflection/mean", "accuracy/abstraction/mean"],
    ),
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
    (
        "Time per phase (s)",
        [
            "time/generate",
            "time/summarize",
            "time/retrieve",
            "time/reward",
            "time/score",
            "time/update",
            "eval/seconds",
        ],
    ),
]


def _number(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _metrics(rows: list[dict]) -> dict[str, list[list[float]]]:
    """metric → [[step, value], ...], numeric values only; eval rows keep only the point metrics, each mean@k with its
    standard error as a third element where it was logged (the page draws its 95% interval)."""
    out: dict[str, list[list[float]]] = {}
    for row in rows:
        step = row.get("step")
        if not isinstance(step, int | float):
            continue
        for key, value in row.items():
            if (
                _number(value)
                and key != "step"
                and not (key.startswith("eval/") and ("stderr" in key or "pass@" in key))
            ):
                error = row.get(f"{key}_stderr") if key.startswith("eval/") else None
                out.setdefault(key, []).append([step, value, error] if _number(error) else [step, value])
    return out


def _eval_table(rows: list[dict]) -> list[dict]:
    """Evaluation during training by step: {"step", "cells": {"<benchmark>/<mode>/mean@k": [mean, s.e., pass@k]}}."""
    table = []
    for row in rows:
        cells = {
            key[5:]: [row[key], row.get(f"{key}_stderr"), row.get(key.replace("/mean@", "/pass@"))]
            for key in row
            if key.startswith("eval/") and "/mean@" in key and not key.endswith("_stderr")
        }
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
        group = groups.setdefault(
            key,
            {
                "step": row.get("step"),
                "problem": row.get("problem", ""),
                "problem_id": row.get("problem_id"),
                "gold": row.get("gold"),
                "rows": [],
            },
        )
        group["rows"].append(
            {
                **{k: row.get(k) for k in ("kind", "feedback", "fallback", "reward", "correct", "retrieved")},
                "prompt": _cut(row.get("prompt")),
                "completion": _cut(row.get("completion")),
            }
        )
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
        audited = pool.entries(limit=MAX_AUDIT, newest=True) if stats["entries"] > MAX_ENTRIES else entries
        worth = pool.entry_worth()
    used: dict[int, list] = {}  # entry id → [step, problem_id, relevance] of the prompts that retrieved it
    for record in retrievals:
        for hit in record.get("retrieved") or []:
            used.setdefault(hit.get("entry_id"), []).append(
                [record.get("step"), record.get("problem_id"), hit.get("relevance")]
            )
    if not retrievals:  # older runs: only the logged samples say what was retrieved
        for group in groups:
            for row in group["rows"]:
                for hit in row.get("retrieved") or []:
                    used.setdefault(hit.get("entry_id"), []).append(
                        [group["step"], group["problem_id"], hit.get("relevance")]
                    )
    return {
        "entries": [
            {
                "id": e.id,
                "problem_id": e.problem_id,
                "problem": e.problem,
                "flow": e.flow_of_thought,
                "principles": e.principles,
                "pitfalls": e.pitfalls,
                "step": e.step,
                "correct": e.correct,
                "reward": e.reward,
                "retrieved_by": used.get(e.id, []),
            }
            for e in entries
        ],
        "attempts": [{"problem_id": a.problem_id, "text": _cut(a.text), "step": a.step} for a in attempts],
        "total_entries": stats["entries"],
        "total_attempts": stats["attempts"],
        "audit": _audit(audited, worth, retrievals),
    }


def _audit(entries: list, worth: dict, retrievals: list[dict], points: int = 400) -> dict:
    """The pool audit's figures (:mod:`lanpo.report.audit`, without golds: the answers check counts answer
    statements only), each credited entry's lift with its interval sorted (at most ``points``, evenly spread), and
    the retrieval concentration curve."""
    from lanpo.report.audit import audit_pool, concentration_curve

    audit = audit_pool(entries, worth, None, retrievals, sample=0)
    lifts = sorted(([e.lift, e.low, e.high] for e in audit.entries if e.lift is not None), key=lambda v: v[0])
    if len(lifts) > points:
        lifts = [lifts[round(i * (len(lifts) - 1) / (points - 1))] for i in range(points)]
    x, y = concentration_curve(audit.retrieval_counts)
    return {
        "summary": audit.summary(),
        "audited": len(entries),
        "lifts": lifts,
        "concentration": [[a, b] for a, b in zip(x, y)],
        "repeated": audit.repeated[:10],
    }


def _eval_step(model, run_dir: Path, last_step: int | None) -> int | None:
    """The training step an evaluation's model stands at: the run's last step for its ``final`` model, N for its
    ``checkpoint-N``, 0 for a model from outside the run (the one it started from); None when unknown."""
    if not isinstance(model, str) or not model:
        return None
    path = Path(model)
    inside = path.parent.name == run_dir.name or path.parent.resolve() == run_dir.resolve()
    if inside and path.name == "final":
        return last_step
    if inside and re.fullmatch(r"checkpoint-\d+", path.name):
        return int(path.name.split("-")[1])
    return None if inside or path.name == run_dir.name else 0


def _evals(run_dir: Path, last_step: int | None = None) -> list[dict]:
    """Every ``results.json`` under the run (``eval-before``, ``eval-after``, ...) in the order they were written:
    name, data, modes' metrics, and the training step its model stands at (:func:`_eval_step`)."""
    found = []
    paths = [*run_dir.glob("*/results.json"), *run_dir.glob("*/*/results.json")]
    for path in sorted(paths, key=lambda p: (p.stat().st_mtime, str(p))):
        try:
            payload = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if isinstance(payload, dict) and isinstance(payload.get("modes"), dict):
            found.append(
                {
                    "name": str(path.parent.relative_to(run_dir)),
                    "model": payload.get("model"),
                    "step": _eval_step(payload.get("model"), run_dir, last_step),
                    "data": payload.get("data"),
                    "k": (payload.get("settings") or {}).get("k"),
                    "modes": {m: v.get("metrics", {}) for m, v in payload["modes"].items()},
                }
            )
    return found


def collect(run_dir: str | Path) -> dict:
    """Everything the report shows about one run, as plain JSON-able data."""
    run = Path(run_dir)
    metrics = read_metrics(run)  # a directory without metrics.jsonl is no run: a clear error
    groups, total_groups = _groups(read_jsonl(run / "samples.jsonl"))
    config = next((f.read_text() for f in (run / "config.yaml", run / "config.json") if f.is_file()), "")
    return {
        "name": run.name,
        "path": str(run),
        "metrics": _metrics(metrics),
        "reward_is_accuracy": reward_is_accuracy(metrics),
        "eval_table": _eval_table(metrics),
        "groups": groups,
        "total_groups": total_groups,
        "pool": _pool(run, groups, read_jsonl(run / "retrievals.jsonl")),
        "evals": _evals(run, max((r["step"] for r in metrics if isinstance(r.get("step"), int)), default=None)),
        "config": config,
    }


def _expand(keys: list[str], logged: set[str]) -> list[str]:
    out = []
    for key in keys:
        head, star, tail = key.partition("*")
        out += sorted(m for m in logged if m.startswith(head) and tail in m[len(head) :]) if star else [key]
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
    data = json.dumps(
        {"runs": runs, "panels": panels(runs), "limits": {"entries": MAX_ENTRIES, "groups": MAX_GROUPS}},
        ensure_ascii=False,
    ).replace("</", "<\\/")  # no "</script>" inside the data block
    return (
        _static("report.html")
        .replace("__TITLE__", html.escape(title))
        .replace("__CSS__", _static("report.css"))
        .replace("__DATA__", data)
        .replace("__JS__", _static("report.js"))
    )


def _static(name: str) -> str:
    """A file of the page (``lanpo/report/static``: the HTML skeleton, its CSS and its JavaScript), inlined into
    every report so that it opens from disk with nothing else."""
    return resources.files("lanpo.report").joinpath("static", name).read_text(encoding="utf-8")


def write_report(run_dirs: list[str | Path], out: str | Path | None = None) -> Path:
    runs = [collect(r) for r in run_dirs]
    empty = [str(d) for d, r in zip(run_dirs, runs) if not any(r["metrics"].values())]
    if empty:
        raise ValueError(
            f"{', '.join(empty)}: metrics.jsonl holds no step yet, so there is nothing to report "
            "(a run logs its first step after its first optimizer step)."
        )
    out = Path(out) if out else Path(run_dirs[0]) / "report.html"
    title = "lanpo report: " + ", ".join(r["name"] for r in runs)
    write_text_atomic(out, render(runs, title))
    return out


def make_server(path: Path, port: int = 8000, host: str = "127.0.0.1"):
    """An HTTP server of the report alone (it is self-contained): ``/`` and ``/<its name>`` answer with it, every
    other path with 404, so the run's pool, config and checkpoints beside it are never served."""
    import errno
    import http.server

    body = Path(path).read_bytes()
    names = {"/", f"/{Path(path).name}"}

    class ReportOnly(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            if self.path.split("?", 1)[0] not in names:
                self.send_error(404, "only the report is served")
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:  # quiet: the terminal shows the one line serve prints
            pass

    try:
        return http.server.ThreadingHTTPServer((host, port), ReportOnly)
    except OSError as error:
        if error.errno == errno.EADDRINUSE:
            raise OSError(f"port {port} is in use: choose another with --port, or --port 0 for any free one") from None
        raise


def serve(path: Path, port: int = 8000) -> None:
    """Serve the report alone on localhost (Ctrl-C stops)."""
    with make_server(path, port) as server:
        print(f"Serving http://127.0.0.1:{server.server_address[1]}/{path.name} (Ctrl-C stops)", flush=True)
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass
