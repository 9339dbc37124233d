"""What a run prints: TRL's progress bar, and one short line a logging step in place of transformers' dictionary
of every metric (the full metrics go to ``metrics.jsonl`` and ``report_to`` as before)."""

from __future__ import annotations

from transformers.trainer_callback import PrinterCallback, ProgressCallback, TrainerCallback


def _fmt(value, digits: int = 2) -> str:
    return f"{value:.{digits}f}" if isinstance(value, int | float) else "—"


def step_line(logs: dict, max_steps: int | None = None) -> str | None:
    """One line for a logging step (reward, accuracy by row kind, feedback share, step time, and any held-out
    accuracy), one for the end of training; None for a log with nothing a person reads (TRL's internals)."""
    step = logs.get("step")
    where = f"step {step}" + (f"/{max_steps}" if max_steps and max_steps > 0 else "") if step is not None else ""
    if "train_runtime" in logs:
        return f"done: {where + ' in ' if where else ''}{logs['train_runtime'] / 60:.1f} min"
    evals = {k.removeprefix("eval/"): v for k, v in logs.items() if k.startswith("eval/") and "/mean@" in k}
    evals = {k: v for k, v in evals.items() if not k.endswith("_stderr")}
    if "reward" not in logs and not evals:
        return None
    parts = [where] if where else []
    if "reward" in logs:
        parts.append(f"reward {_fmt(logs['reward'])}")
        kinds = [k for k in ("scratch", "feedback") if f"accuracy/{k}/mean" in logs]
        if kinds:
            parts.append("accuracy " + ", ".join(f"{k} {_fmt(logs[f'accuracy/{k}/mean'])}" for k in kinds))
        if "lanpo/feedback_share" in logs:
            parts.append(f"feedback share {_fmt(logs['lanpo/feedback_share'])}")
        if "step_time" in logs:
            parts.append(f"{_fmt(logs['step_time'], 1)} s/step")
    parts += [f"{name} {_fmt(value, 3)}" for name, value in sorted(evals.items())]
    return " | ".join(parts)


class StepLineCallback(ProgressCallback):
    """transformers' progress bars, with :func:`step_line` written under the bar instead of the raw dictionary."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.is_world_process_zero and self.training_bar is not None and logs:
            line = step_line({"step": state.global_step, **logs}, state.max_steps)
            if line:
                self.training_bar.write(line)


class StepLinePrinter(TrainerCallback):
    """With ``disable_tqdm``: :func:`step_line` printed in place of transformers' raw dictionary."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.is_local_process_zero and logs:
            line = step_line({"step": state.global_step, **logs}, state.max_steps)
            if line:
                print(line, flush=True)


def use_step_lines(trainer) -> None:
    """Swap transformers' printing callbacks on ``trainer`` for the one-line ones."""
    if trainer.callback_handler.pop_callback(ProgressCallback) is not None:
        trainer.add_callback(StepLineCallback)
    if trainer.callback_handler.pop_callback(PrinterCallback) is not None:
        trainer.add_callback(StepLinePrinter)
