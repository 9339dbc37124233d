"""`lanpo train ARGS` in this process (alone, or under `accelerate launch`), for the kill-and-resume tests.

* summaries are answered with a canned one (a random tiny model never writes a parseable summary), so the pool
  fills and every pending trial becomes an entry whose rollout id says which step and process it came from;
* ``LANPO_KILL_AT=step:N`` SIGKILLs every process in the middle of step N (after its rollouts), and
  ``LANPO_KILL_AT=save:N`` while checkpoint-N is being written (after the model, before the RNG states);
  ``LANPO_INTERRUPT_AT`` sends SIGINT (Ctrl-C) at the same places instead;
* ``LANPO_REPORT=DIR`` makes every process write ``DIR/rank{k}.json`` with its pool's digest and entries, and
  the last step's gathered rewards, feedback flags and this process's advantages;
* ``LANPO_LENGTH_REWARD=1`` rewards completion length (mod 4), so rewards vary between rollouts.
"""

from __future__ import annotations

import json
import os
import signal
import sys

from lanpo.trainer import LanpoTrainer

CANNED = " add the two numbers.\nPRINCIPLES:\n- add the ones digits first\nPITFALLS:\n- forgetting to carry"


def _canned_summaries() -> None:
    original = LanpoTrainer._generate_ids

    def generate(self, prompt_ids):
        completions, logprobs = original(self, prompt_ids)
        tok = self.processing_class
        canned = tok.encode(CANNED, add_special_tokens=False) + [tok.eos_token_id]
        for k, ids in enumerate(prompt_ids):
            if "Distill what this attempt teaches" in tok.decode(ids):
                completions[k] = list(canned)
        return completions, logprobs

    LanpoTrainer._generate_ids = generate


def _kill_at(spec: str, sig: int = signal.SIGKILL) -> None:
    where, step = spec.split(":")
    step = int(step)
    hook = {"step": "after_rollouts", "save": "_save_rng_state"}[where]
    original = getattr(LanpoTrainer, hook)

    def killer(self, *args, **kwargs):
        if self.state.global_step == (step - 1 if where == "step" else step):
            os.kill(os.getpid(), sig)
        return original(self, *args, **kwargs)

    setattr(LanpoTrainer, hook, killer)


def _length_reward() -> None:
    import lanpo.trainer
    from lanpo.verify.rewards import completion_text

    def accuracy(completions, **kwargs):
        return [float(len(completion_text(c)) % 4) for c in completions]

    lanpo.trainer.make_accuracy_reward = lambda verifier=None: accuracy


def _report(folder: str) -> None:
    original = LanpoTrainer.train
    after = LanpoTrainer.after_rollouts

    def record(self, output, generation):
        after(self, output, generation)
        self._recorded = {
            "rewards_per_func": generation.rewards_per_func.tolist(),
            "flags": [r.has_feedback for r in generation.rows],
            "advantages": output["advantages"].tolist(),
        }

    LanpoTrainer.after_rollouts = record

    def train(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, f"rank{self.accelerator.process_index}.json"), "w") as handle:
            json.dump(
                {
                    "digest": self.pool.digest(),
                    "world_size": self.accelerator.num_processes,
                    "rollout_ids": [r for e in self.pool.entries() for r in e.rollout_ids],
                    **getattr(self, "_recorded", {}),
                },
                handle,
            )
        return result

    LanpoTrainer.train = train


def main() -> int:
    _canned_summaries()
    if os.environ.get("LANPO_KILL_AT"):
        _kill_at(os.environ["LANPO_KILL_AT"])
    if os.environ.get("LANPO_INTERRUPT_AT"):
        # A shell's background job starts with SIGINT ignored, and Python then keeps it ignored: a user's Ctrl-C
        # reaches a foreground run, so the test restores Python's default handler.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        _kill_at(os.environ["LANPO_INTERRUPT_AT"], signal.SIGINT)
    if os.environ.get("LANPO_LENGTH_REWARD"):
        _length_reward()
    if os.environ.get("LANPO_REPORT"):
        _report(os.environ["LANPO_REPORT"])
    from lanpo.cli import main as lanpo

    return lanpo(["train", *sys.argv[1:]])


if __name__ == "__main__":
    sys.exit(main())
