"""Launched by test_trainer.py under `accelerate launch --num_processes 2`: LANPO runs on two processes.

``multiprocess_run.py MODEL OUT``: one run; each process writes its pool's digest (every rank must hold the same
pool). ``multiprocess_run.py MODEL OUT GROUPING``: one run with that advantage grouping (scale_rewards=batch,
so the baseline spans both processes); each process writes, per step, its own rows' advantages and the gathered
rewards and feedback flags, for the test to compare with one process's computation on the same rollouts.
``multiprocess_run.py MODEL OUT uneven``: ``feedback_trigger unsolved`` with ``feedback_source reference``, where
rank 0's groups all count as solved and rank 1's as failed, so only rank 1 has feedback rows to generate; each
process writes how many feedback rows it generated per step (``generation_rounds phased``: the feedback call after
GRPO's rollout). ``multiprocess_run.py MODEL OUT uneven-judge``: the same in one call (the trigger reads the
scores of the attempts made a step ahead, so from the second step) with the default source (reflection and
abstraction) and the LLM relevance judge, whose forwards every process must join. ``multiprocess_run.py MODEL OUT
all``: every run above in one launch (:func:`every_run`).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1]))  # the tests folder: test_trainer's helpers

from accelerate.utils import gather_object  # noqa: E402

from test_trainer import make_trainer, stub_summaries  # noqa: E402


def pool_digest(model_dir: Path, out: Path) -> None:
    trainer = make_trainer(model_dir, out, "run", max_steps=3, per_device_train_batch_size=4)
    stub_summaries(trainer)
    trainer.train()
    state = trainer.accelerator.state
    (out / f"rank{state.process_index}.json").write_text(
        json.dumps(
            {
                "world_size": state.num_processes,
                "digest": trainer.pool.digest(),
                "entries": len(trainer.pool),
            }
        )
    )


def advantages(model_dir: Path, out: Path, grouping: str) -> None:
    trainer = make_trainer(
        model_dir,
        out,
        grouping,
        max_steps=2,
        per_device_train_batch_size=4,
        advantage_grouping=grouping,
        scale_rewards="batch",
        feedback_ratio=0.5,
        generation_rounds="phased",  # every step has feedback rows (one: the first step's would all fall back)
    )
    stub_summaries(trainer)
    steps, after = [], trainer.after_rollouts

    def record(output, generation):
        after(output, generation)
        flags = [f for part in gather_object([[r.has_feedback for r in generation.rows]]) for f in part]
        steps.append(
            {
                "advantages": output["advantages"].tolist(),
                "rewards": generation.rewards_per_func.tolist(),
                "flags": flags,
            }
        )

    trainer.after_rollouts = record
    trainer.train()
    rank = trainer.accelerator.process_index
    (out / f"{grouping}-rank{rank}.json").write_text(
        json.dumps({"weights": trainer.reward_weights.tolist(), "steps": steps})
    )


# The uneven-trigger launches: rank 0's groups all solve, rank 1's all fail, with these sources.
UNEVEN = {  # the phased feedback call after GRPO's rollout; one call, triggered by the stored attempts' scores
    "uneven": dict(feedback_source="reference", summaries_per_group=0, generation_rounds="phased"),
    "uneven-judge": dict(feedback_source="self", relevance_scorer="llm", generation_rounds="one"),
}


def uneven_triggers(model_dir: Path, out: Path, name: str) -> None:
    trainer = make_trainer(
        model_dir, out, name, max_steps=2, per_device_train_batch_size=4, feedback_trigger="unsolved", **UNEVEN[name]
    )
    if trainer.args.summaries_per_group:
        stub_summaries(trainer)
    rank = trainer.accelerator.process_index
    trainer.policy.rollout.score = lambda rows: [rank == 0] * len(rows)  # rank 0 solves everything, rank 1 nothing
    steps, after = [], trainer.after_rollouts

    def record(output, generation):
        after(output, generation)
        steps.append(sum(r.has_feedback for r in generation.rows))

    trainer.after_rollouts = record
    trainer.train()
    kinds = sorted({r.kind for r in trainer.last_generation.rows})
    (out / f"{name}-rank{rank}.json").write_text(json.dumps({"feedback_rows": steps, "kinds": kinds}))


def every_run(model_dir: Path, out: Path) -> None:
    """Each run above, one after another in the same two processes (one launch, not five: each launch's start-up,
    three processes importing torch and TRL, cost more than its run). A finished trainer ends the process group
    (``Accelerator.end_training``); here the group is kept for the next run and ended after the last."""
    import torch.distributed as dist
    from accelerate import Accelerator

    def end_training(self):  # accelerate's, less the group's end
        for tracker in self.trackers:
            tracker.finish()

    Accelerator.end_training = end_training
    pool_digest(model_dir, out)
    for grouping in ("separate", "scratch-baseline"):
        advantages(model_dir, out, grouping)
    for name in UNEVEN:
        uneven_triggers(model_dir, out, name)
    rank = dist.get_rank()
    dist.barrier()
    (out / f"all-rank{rank}.json").write_text(json.dumps({"runs": 5}))
    dist.destroy_process_group()


if __name__ == "__main__":
    model, output = Path(sys.argv[1]), Path(sys.argv[2])
    output.mkdir(parents=True, exist_ok=True)
    if len(sys.argv) > 3 and sys.argv[3] == "all":
        every_run(model, output)
    elif len(sys.argv) > 3 and sys.argv[3] in UNEVEN:
        uneven_triggers(model, output, sys.argv[3])
    elif len(sys.argv) > 3:
        advantages(model, output, sys.argv[3])
    else:
        pool_digest(model, output)
