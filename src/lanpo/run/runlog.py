"""What a run writes for people to read: ``metrics.jsonl``, ``samples.jsonl``, curves, and the final model.

The trainer gathers the numbers; the functions here turn them into metric names (``lanpo/feedback_share``,
``reward/feedback/mean``, ...), sample lines and PNG plots. ``lanpo compare`` reads runs back with
:func:`read_metrics`.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

from transformers import TrainerCallback

from lanpo.prompts import solve_messages
from lanpo.rollout import FEEDBACK_KINDS, Row


class MetricsFileCallback(TrainerCallback):
    """Append every log line to ``metrics.jsonl`` in the run directory (main process)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.is_world_process_zero and logs:
            with self.path.open("a") as handle:
                handle.write(json.dumps({"step": state.global_step, **logs}, default=float) + "\n")


# Every metric lanpo logs beside TRL's own (`loss`, `reward`, `kl`, `entropy`, `completions/*`, `clip_ratio/*`,
# ...), with its meaning: docs/reference/metrics.md is generated from it, and a test checks that a run logs no
# lanpo metric missing here. ``<x>`` stands for a part that varies.
METRICS: dict[str, str] = {
    "lanpo/feedback_ratio": "p_t planned for this step (the schedule's value)",
    "lanpo/feedback_share": "realized p_t: share of rows generated with a feedback context",
    "lanpo/fallback_share": "share of rows planned as feedback that got the plain prompt",
    "lanpo/fallback/<reason>": "the same, by reason (no_attempt, no_relevant_entry, ...)",
    "lanpo/feedback_tokens_per_prompt": "tokens a feedback context added to a prompt, on average",
    "reward/<kind>/mean": "mean reward of rows of a kind: scratch, feedback, reflection, abstraction",
    "accuracy/<kind>/mean": "share of rows of a kind whose answer the verifier credits",
    "completions/truncated/<kind>": "share of scratch / feedback rows that reached their length limit",
    "lanpo/feedback_lift": "accuracy of feedback rows minus that of the scratch rows of the same groups",
    "lanpo/all_fail_share": "share of groups in which every row failed (no reward signal but failure; every arm)",
    "lanpo/triggered_share": "feedback_trigger unsolved: share of groups whose scratch rows all failed",
    "lanpo/rescued_share": "feedback_trigger unsolved: share of groups where a feedback row is right though "
    "every scratch row was wrong",
    "lanpo/rescue_rate": "feedback_trigger unsolved: rescued groups over triggered groups (steps with any)",
    "lanpo/pool_size": "entries in the experience pool",
    "lanpo/pool_problems": "problems with at least one entry in the pool",
    "lanpo/lessons_dropped": "lessons left out of abstraction contexts (stating an answer, talking about grades)",
    "retrieval/hit_rate": "share of retrievals that found an entry over gamma",
    "retrieval/relevance_pass_rate": "share of scored candidates whose relevance reached gamma",
    "retrieval/candidates_per_query": "BM25 candidates scored per retrieval",
    "summaries/requested": "trials sent to be summarized",
    "summaries/parse_failures": "summaries that did not parse into principles and pitfalls",
    "summaries/parse_rate": "summaries that parsed, over those that ended",
    "summaries/added": "pool entries written this step",
    "summaries/carried": "summaries cut by the rollouts' length limit, going on in the next batch",
    "lanpo/strip_weight_mean": "strip / strip-sequence: mean importance weight on feedback tokens",
    "lanpo/strip_weight_clipped": "strip / strip-sequence: share of feedback tokens whose weight hit the clip",
    "kl/scratch": "KL estimate over scratch rows' tokens (TRL's k3: the policy's drift from the reference)",
    "kl/feedback": "KL estimate over feedback rows' tokens (importance-weighted k2 where sampled under a context)",
    "step_time": "seconds of the optimizer step, rollouts included",
    "time/<part>": "seconds of the step spent in generate, summarize, retrieve, reward, score, update",
    "verifier/no_answer_rate": "share of completions with no final answer",
    "verifier/hedged_rate": "share of completions that state several values (scored 0)",
    "verifier/timeouts": "answers whose verification ran past the time limit (scored 0)",
    "eval/<benchmark>/<mode>/mean@<k>": "held-out accuracy during training (eval_every); also _stderr, pass@<k>",
    "eval/<benchmark>/<mode>/context_rate": "retrieval mode: share of held-out prompts that got a context",
    "eval/seconds": "seconds one evaluation during training took",
}


def metric_pattern(name: str) -> str:
    """The METRICS key a logged name belongs to (``reward/scratch/mean`` → ``reward/<kind>/mean``)."""
    import re

    for key in METRICS:
        regex = "^" + re.sub(r"<[a-z]+>", "[^/]+", re.escape(key).replace(r"\<", "<").replace(r"\>", ">")) + "$"
        if re.match(regex, name):
            return key
    return ""


class RowRecord(NamedTuple):
    """What step metrics need of one row (small, so every process can gather every row's)."""

    kind: str  # what the plan asked for: scratch | reflection | abstraction
    has_feedback: bool  # whether it was generated with feedback (a planned one may have fallen back)
    reward: float
    correct: bool
    context_tokens: int  # how many tokens the feedback context added to the prompt
    fallback: str | None  # why planned feedback fell back to the plain prompt
    group: str = ""  # which group of G it belongs to (unique in a step over every process)
    triggered: bool | None = None  # feedback_trigger unsolved: its group failed from scratch (None: always)
    truncated: bool = False  # its completion reached its length limit


def row_record(row: Row, reward: float, correct: bool, group: str = "") -> RowRecord:
    extra = len(row.context_ids) - len(row.plain_ids) if row.context_ids is not None else 0
    return RowRecord(
        row.kind,
        row.has_feedback,
        float(reward),
        bool(correct),
        extra,
        row.fallback,
        group,
        row.triggered,
        row.truncated,
    )


def feedback_metrics(records: Sequence[RowRecord], feedback_ratio: float) -> dict[str, float]:
    """Planned vs realized feedback, and reward and accuracy by kind, over every process's rows."""
    planned = [x for x in records if x.kind in FEEDBACK_KINDS]
    with_feedback = [x for x in records if x.has_feedback]
    metrics = {
        "lanpo/feedback_ratio": feedback_ratio,
        "lanpo/feedback_share": len(with_feedback) / len(records),
        "lanpo/fallback_share": sum(not x.has_feedback for x in planned) / len(planned) if planned else 0.0,
    }
    for reason in sorted({x.fallback for x in planned if not x.has_feedback}):  # why planned feedback fell back
        metrics[f"lanpo/fallback/{reason or 'unknown'}"] = sum(
            x.fallback == reason and not x.has_feedback for x in planned
        ) / len(planned)
    if with_feedback:
        metrics["lanpo/feedback_tokens_per_prompt"] = sum(x.context_tokens for x in with_feedback) / len(with_feedback)
    groups = {
        "feedback": with_feedback,
        "scratch": [x for x in records if not x.has_feedback],
        "reflection": [x for x in with_feedback if x.kind == "reflection"],
        "abstraction": [x for x in with_feedback if x.kind == "abstraction"],
    }
    for name, part in groups.items():
        if part:
            metrics[f"reward/{name}/mean"] = sum(x.reward for x in part) / len(part)
            metrics[f"accuracy/{name}/mean"] = sum(x.correct for x in part) / len(part)
    for name in ("scratch", "feedback"):
        if groups[name]:
            metrics[f"completions/truncated/{name}"] = sum(x.truncated for x in groups[name]) / len(groups[name])
    metrics.update(lift_and_trigger_metrics(records))
    return metrics


def lift_and_trigger_metrics(records: Sequence[RowRecord]) -> dict[str, float]:
    """``lanpo/all_fail_share``: groups in which every row failed (GRPO learns nothing from them but a KL pull).
    ``lanpo/feedback_lift``: accuracy of feedback rows minus that of the scratch rows of the same groups
    (groups holding both kinds; absent where no group holds both). Under feedback_trigger unsolved, at every step
    ``lanpo/triggered_share`` (groups that failed from scratch) and ``lanpo/rescued_share`` (groups where a
    feedback row is right though every scratch row was wrong), and ``lanpo/rescue_rate`` (rescued over triggered
    groups) where any group was triggered."""
    by_group: dict[str, list[RowRecord]] = {}
    for x in records:
        by_group.setdefault(x.group, []).append(x)
    mixed = [
        rows
        for rows in by_group.values()
        if any(x.has_feedback for x in rows) and not all(x.has_feedback for x in rows)
    ]
    metrics: dict[str, float] = {
        "lanpo/all_fail_share": sum(not any(x.correct for x in rows) for rows in by_group.values()) / len(by_group)
    }
    if mixed:
        feedback = [x.correct for rows in mixed for x in rows if x.has_feedback]
        scratch = [x.correct for rows in mixed for x in rows if not x.has_feedback]
        metrics["lanpo/feedback_lift"] = sum(feedback) / len(feedback) - sum(scratch) / len(scratch)
    if any(x.triggered is not None for x in records):
        triggered = [rows for rows in by_group.values() if rows[0].triggered]
        rescued = sum(any(x.has_feedback and x.correct for x in rows) for rows in triggered)
        metrics["lanpo/triggered_share"] = len(triggered) / len(by_group)
        metrics["lanpo/rescued_share"] = rescued / len(by_group)  # of all groups: 0 when none was triggered
        if triggered:
            metrics["lanpo/rescue_rate"] = rescued / len(triggered)
    return metrics


def step_metrics(
    records: Sequence[RowRecord],
    feedback_ratio: float,
    pool_stats: dict,
    retrieval: dict[str, float],
    summaries: dict,
    counts: dict,
) -> dict[str, float]:
    """Every lanpo metric of one step: feedback, pool, retrieval, summary parsing."""
    metrics = {
        **feedback_metrics(records, feedback_ratio),
        "lanpo/pool_size": float(pool_stats["entries"]),
        "lanpo/pool_problems": float(pool_stats["problems"]),
        **retrieval,
        "lanpo/lessons_dropped": float(counts.get("lessons_dropped", 0)),
    }
    if summaries.get("requested"):
        failed = summaries.get("parse_failed", 0)
        metrics.update(
            {
                "summaries/requested": float(summaries["requested"]),
                "summaries/parse_failures": float(failed),
                "summaries/parse_rate": (summaries["requested"] - failed) / summaries["requested"],
                "summaries/added": float(summaries.get("parsed", 0)),
            }
        )
    if "carried" in summaries:
        metrics["summaries/carried"] = float(summaries["carried"])  # not ended yet: they go on in the next batch
    return metrics  # strip weights are logged where they are applied, in the loss (lanpo.loss_hooks)


def real_prompts(logged: list, contexts: list) -> None:
    """Put each feedback row's real prompt (its context) into TRL's completions-table prompts, paired from the
    newest: TRL logs every row with its plain prompt."""
    for k, context in zip(range(len(logged) - 1, -1, -1), reversed(contexts)):
        logged[k] = context if context is not None else logged[k]


def time_metrics(timer: dict) -> dict[str, float]:
    """Seconds per phase of one step: generate, summarize, retrieve, reward (verification), update (loss forward,
    backward, optimizer) and ``time/score``, the rest of the rollout (reference and old log-probabilities)."""
    phases = ("generate", "summarize", "retrieve", "reward")
    metrics = {f"time/{key}": float(timer.get(key, 0.0)) for key in (*phases, "update")}
    rest = timer.get("rollout_total", 0.0) - sum(timer.get(k, 0.0) for k in phases)
    return {**metrics, "time/score": max(0.0, rest)}


def write_samples(
    path: Path,
    rows: list[Row],
    rewards: Sequence[float],
    step: int,
    limit: int,
    g: int,
    correct: Sequence[bool] | None = None,
) -> None:
    """Append whole groups to ``samples.jsonl`` (``limit`` rows, at least one group): each row's real prompt
    (its feedback context, else the plain prompt), completion, kind, reward, fallback reason and, for abstraction
    rows, the pool entries retrieved with their relevance."""
    if limit <= 0:
        return
    groups = max(1, limit // g)
    with path.open("a") as handle:
        for i in range(min(len(rows), groups * g)):
            r = rows[i]
            handle.write(
                json.dumps(
                    {
                        "step": step,
                        "group": i // g,
                        "problem_id": r.problem_id,
                        "problem": r.problem,
                        "kind": r.kind,
                        "feedback": r.has_feedback,
                        "fallback": r.fallback,
                        "prompt": (r.context or solve_messages(r.problem))[-1]["content"],
                        "completion": r.text,
                        "reward": float(rewards[i]),
                        "correct": bool(correct[i]) if correct is not None else None,
                        "gold": r.gold,
                        "retrieved": r.retrieved,
                    },
                    ensure_ascii=False,
                )
                + "\n"
            )


def write_retrievals(path: Path, rows: list[Row], step: int, g: int) -> None:
    """Append, per group that retrieved pool entries this step, which entries passed γ with what relevance."""
    with path.open("a") as handle:
        for s in range(0, len(rows), g):
            hits = next((r.retrieved for r in rows[s : s + g] if r.retrieved), None)
            if hits:
                handle.write(json.dumps({"step": step, "problem_id": rows[s].problem_id, "retrieved": hits}) + "\n")


def save_final_model(trainer, out_dir: str | Path) -> Path:
    """``out_dir/final``: the trained model and tokenizer, through the trainer's own ``save_model`` (which
    gathers ZeRO-3 / FSDP shards); a LoRA run also keeps its adapter in ``final-adapter`` and saves the merged
    model in ``final``, ready to evaluate."""
    out_dir = Path(out_dir)
    final = out_dir / "final"
    model = trainer.accelerator.unwrap_model(trainer.model)
    if hasattr(model, "merge_and_unload"):
        trainer.save_model(str(out_dir / "final-adapter"))
        if trainer.accelerator.is_main_process:
            model.merge_and_unload().save_pretrained(final)
            trainer.processing_class.save_pretrained(final)
    else:
        trainer.save_model(str(final))
    return final


CARD_FIELDS = (
    "data",
    "num_generations",
    "feedback_ratio",
    "feedback_schedule",
    "reflection_share",
    "reflection_source",
    "relevance_scorer",
    "relevance_threshold",
    "retrieval_top_k",
    "context_in_loss",
    "advantage_grouping",
    "beta",
    "learning_rate",
    "max_completion_length",
    "temperature",
    "answer_extraction",
    "seed",
)


def model_card(config: dict, problems: int, steps: int) -> str:
    """``final/README.md``: what the model is, the method, and the settings that made it."""
    rows = "\n".join(f"| `{k}` | `{config.get(k)}` |" for k in CARD_FIELDS if k in config)
    return f"""---
base_model: {config.get("model_name_or_path")}
library_name: transformers
tags: [lanpo, grpo, trl, reinforcement-learning, math]
---

# {config.get("model_name_or_path")} trained with LANPO

Trained with [lanpo](https://github.com/) for {steps} steps on {problems} problems: **LANPO** (Language-And-Numerical
Policy Optimization, [arXiv 2510.16552](https://arxiv.org/abs/2510.16552)), GRPO with a KL term whose rollout
groups are partly generated with language feedback from the policy's own experience pool (reward-agnostic
reflection on its earlier attempts, and principles and pitfalls of relevant other problems). A share p_t of each
group had feedback; the rest, like evaluation, started from scratch.

| setting | value |
|---|---|
{rows}

The full resolved configuration is the run's `config.yaml`. Evaluate zero-shot with `lanpo eval --model THIS_DIR`.
"""


def push_final_model(final: Path, repo_id: str, private: bool | None = None) -> None:
    """Upload ``final`` (model, tokenizer, model card) to the hub; a clear error when that is not possible."""
    from huggingface_hub import HfApi

    try:
        api = HfApi()
        api.create_repo(repo_id, private=private, exist_ok=True)
        api.upload_folder(folder_path=str(final), repo_id=repo_id, commit_message="lanpo: final model")
    except Exception as error:  # offline, no token, no rights: the model is safe on disk either way
        raise RuntimeError(
            f"Pushing {final} to the hub as {repo_id!r} failed ({type(error).__name__}: {error}). "
            f"The model is saved in {final}; push it later with `huggingface-cli upload`."
        ) from error


def read_jsonl(path: str | Path) -> list[dict]:
    """The objects of a run's JSONL log (none when it is missing); lines that do not parse are skipped (a run
    killed mid-write leaves a half line)."""
    path, rows = Path(path), []
    if path.is_file():
        with path.open(encoding="utf-8", errors="replace") as handle:
            for line in handle:
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if isinstance(row, dict):
                    rows.append(row)
    return rows


def read_metrics(run_dir: str | Path) -> list[dict]:
    """The per-step log lines of a run (``metrics.jsonl``)."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{run_dir} has no metrics.jsonl: is it a lanpo run directory?")
    return [row for row in read_jsonl(path) if "step" in row]


def series(rows: list[dict], key: str) -> tuple[list[int], list[float]]:
    points = [(r["step"], r[key]) for r in rows if r.get(key) is not None]
    return [p[0] for p in points], [float(p[1]) for p in points]


def reward_is_accuracy(rows: list[dict]) -> bool:
    """True when every logged reward/<kind>/mean equals accuracy/<kind>/mean (the reward is the verifier's 0/1):
    then one plot shows both."""
    pairs = [
        (v, r.get("accuracy/" + k[len("reward/") :]))
        for r in rows
        for k, v in r.items()
        if k.startswith("reward/") and k.endswith("/mean")
    ]
    return all(a is not None and abs(float(v) - float(a)) < 1e-9 for v, a in pairs)


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_run(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Reward and accuracy per step (one panel when they are equal), feedback vs scratch rollouts, and pool growth."""
    plt = _plt()
    rows = read_metrics(run_dir)
    out = Path(out or Path(run_dir) / "training_curves.png")
    same = reward_is_accuracy(rows)
    metrics = ["reward"] if same else ["reward", "accuracy"]
    fig, axes = plt.subplots(1, len(metrics) + 1, figsize=(5 * (len(metrics) + 1), 4))
    for ax, metric in zip(axes, metrics):
        for kind, style in (("scratch", "-o"), ("feedback", "-s"), ("reflection", ":"), ("abstraction", "--")):
            x, y = series(rows, f"{metric}/{kind}/mean")
            if x:
                ax.plot(x, y, style, label=kind, markersize=3)
        ax.set_title("reward = accuracy per step (0/1 verifier reward)" if same else f"{metric} per step")
        ax.set_xlabel("step")
        ax.legend()
        ax.grid(alpha=0.3)
    x, y = series(rows, "lanpo/pool_size")
    axes[-1].plot(x, y, "-", color="tab:green")
    axes[-1].set_title("experience pool entries")
    axes[-1].set_xlabel("step")
    axes[-1].grid(alpha=0.3)
    fig.suptitle(Path(run_dir).name)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def plot_compare(
    runs: dict[str, list[dict]],
    out: str | Path,
    keys=("reward/scratch/mean", "reward/feedback/mean", "lanpo/pool_size"),
) -> Path:
    """One panel per metric, one line per run."""
    plt = _plt()
    fig, axes = plt.subplots(1, len(keys), figsize=(5 * len(keys), 4))
    axes = axes if len(keys) > 1 else [axes]
    for ax, key in zip(axes, keys):
        for name, rows in runs.items():
            x, y = series(rows, key)
            if x:
                ax.plot(x, y, "-o", markersize=3, label=name)
        ax.set_title(key)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def check_writable(folder: str | Path, what: str, keep: bool = False) -> None:
    """Fail before any work when ``folder`` (created if missing) cannot take files: a write probe. A failed check
    removes every folder it created; a passed one too, unless ``keep`` (the caller writes there next, and other
    processes may be probing the same folder at once)."""
    folder = Path(folder)
    missing = [p for p in (folder, *folder.parents) if not p.exists()]
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".lanpo-write-check-"):
            pass
    except OSError as error:
        _remove(missing)
        raise OSError(
            f"{what} {folder} cannot be written ({error.strerror or error}): nothing was run; name a folder you can "
            "write to."
        ) from None
    if not keep:
        _remove(missing)


def _remove(folders: list[Path]) -> None:
    for created in folders:  # deepest first
        try:
            created.rmdir()
        except OSError:
            pass
