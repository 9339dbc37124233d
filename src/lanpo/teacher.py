"""The teacher of the scoring route (``feedback_route score`` / ``both``): the model that reads each chosen plain
rollout under its feedback context and gives the loss its per-token log-probabilities (:mod:`lanpo.score` turns
them into advantages).

Which model that is (``score_teacher``): the live policy; the start model, held by TRL's frozen reference model
where there is one, by the policy with its PEFT adapter off, else by a frozen copy; or an EMA copy that follows the
policy after each optimizer step (saved in checkpoints, so a resumed run goes on with it).
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from accelerate.utils import extract_model_from_parallel, gather_object, is_peft_model
from transformers import TrainerCallback
from trl.trainer.callbacks import SyncRefModelCallback

from lanpo import score
from lanpo.engine.generation import chat_ids, left_pad
from lanpo.feedback.privileged import Reference
from lanpo.plan import Scoring
from lanpo.policy import Policy
from lanpo.run.meter import StepMeter
from lanpo.verify.answers import find_answer

if TYPE_CHECKING:
    from lanpo.rollout import Row

logger = logging.getLogger(__name__)

EMA_TEACHER = "ema_teacher.pt"  # score_teacher ema: a checkpoint's teacher weights


class Teacher:
    """The scoring route's teacher for one run, reading the policy through its adapter (:class:`Policy`): ``weights``
    is its own copy where it has one (an EMA teacher, or the start model where no frozen reference holds it), else
    None. ``run_code`` is the reward's sandbox (execution reports); ``meter`` counts their outcomes."""

    def __init__(
        self, policy: Policy, scoring: Scoring, args, meter: StepMeter, run_code: Callable[[list], list] | None = None
    ) -> None:
        self.policy, self.scoring, self.args, self.meter, self.run_code = policy, scoring, args, meter, run_code
        self.weights = self._own_weights()

    def _own_weights(self):
        policy, scoring = self.policy, self.scoring
        if not scoring.own_teacher:
            return None
        frozen_reference = policy.ref_model is not None and not self.args.sync_ref_model
        if not scoring.ema and (frozen_reference or is_peft_model(policy.model)):
            return None
        if is_peft_model(policy.model):
            raise ValueError("score_teacher ema needs full fine-tuning (a PEFT policy's EMA is not supported yet).")
        weights = copy.deepcopy(policy.accelerator.unwrap_model(policy.model)).eval()
        weights.requires_grad_(False)
        if scoring.ema:
            policy.add_callback(EMATeacher(weights, scoring_rate=self.args.score_ema_rate))
        return weights

    @contextmanager
    def model(self):
        """The model that scores under the context: the live policy, the start model (the frozen reference, the
        policy with its adapter off, or a copy) or the EMA copy."""
        policy = self.policy
        if not self.scoring.own_teacher:
            yield policy.model
        elif self.weights is not None:
            yield self.weights
        elif policy.ref_model is not None:
            yield policy.ref_model
        else:  # PEFT: the start model is the policy with its adapter off, as TRL's reference pass does
            with policy.accelerator.unwrap_model(policy.model).disable_adapter():
                yield policy.model

    def score_rows(self, output: dict, rows: list[Row], correct: list[bool], references: dict[str, Reference]) -> int:
        """``lanpo_teacher_logps`` (and the wrong contexts' under the contrastive form, and the answer tokens) for
        this step's scored rows: one no-grad teacher forward of each scored row's completion after its context
        prompt, the completion's token ids carried over as sampled (never decoded and re-encoded), so the first
        completion token follows the same assistant-turn header as in the plain prompt. Prompts are not
        truncated. Returns how many failed plain rows had no context to be scored under."""
        policy, scoring, g = self.policy, self.scoring, self.args.num_generations
        reports = self.reports(rows, correct) if scoring.source == "execution" else [None] * len(rows)
        seen = [
            score.ScoredRow(
                r.problem_id,
                r.problem,
                r.text,
                ok,
                references.get(r.problem_id) or Reference(r.gold, gold_kind=r.gold_kind),
                report,
            )
            for r, ok, report in zip(rows, correct, reports)
        ]
        contexts = score.teacher_contexts(seen, g, scoring)
        contexts = [None if r.has_feedback else c for r, c in zip(rows, contexts)]  # generated rows: trained as such
        completion_ids, completion_mask = output["completion_ids"], output["completion_mask"]
        device, width = completion_ids.device, completion_ids.size(1)
        teacher = torch.full(completion_ids.shape, float("nan"), device=device)
        picked = [i for i, c in enumerate(contexts) if c is not None]
        k = scoring.wrong if scoring.contrastive else 0
        wrong = torch.full((len(rows), k, width), float("nan"), device=device) if k else None
        prompts = [(i, -1, contexts[i].right) for i in picked]
        prompts += [(i, j, m) for i in picked for j, m in enumerate(contexts[i].wrong)]
        logps = self.logps([chat_ids(policy.tokenizer, m) for _, _, m in prompts], [i for i, _, _ in prompts], output)
        for (i, j, _), values in zip(prompts, logps):
            if j < 0:
                teacher[i] = values
            else:
                wrong[i, j] = values
        output[score.TEACHER_LOGPS] = teacher
        if wrong is not None:
            output[score.WRONG_LOGPS] = wrong
        answer = torch.zeros(completion_ids.shape, dtype=torch.bool, device=device)
        decode = policy.decode
        for i in picked:
            ids = completion_ids[i][completion_mask[i].bool()].tolist()
            found, _ = find_answer(rows[i].text, self.args.answer_extraction, rows[i].problem)
            mask = score.answer_token_mask(ids, decode, score.answer_span(rows[i].text, found))
            answer[i, : len(mask)] = torch.tensor(mask, dtype=torch.bool)
        output[score.ANSWER_MASK] = answer
        return sum(1 for r, c, ok in zip(rows, contexts, correct) if c is None and not r.has_feedback and not ok)

    def reports(self, rows: list[Row], correct: list[bool]) -> list[str | None]:
        """``execution``: what each plain row to be scored did on its problem's public examples, run in the reward's
        sandbox in one batch (None: a row not scored, a generated row, or a problem that shows no example)."""
        from lanpo.feedback.execution import try_attempts

        wanted = [
            i
            for i, (r, ok) in enumerate(zip(rows, correct))
            if not r.has_feedback and not (self.scoring.failed_only and ok)
        ]
        tried = try_attempts(
            [(rows[i].problem, rows[i].text) for i in wanted], self.run_code, self.args.answer_extraction
        )
        out: list[str | None] = [None] * len(rows)
        for i, t in zip(wanted, tried):
            out[i] = None if isinstance(t, str) else t.report
        self.meter.counts.update(f"public_{t.outcome}" for t in tried if not isinstance(t, str))
        return out

    def logps(self, prompts: list[list[int]], rows: list[int], output: dict) -> list:
        """Per (prompt, row): the teacher's per-token log-probabilities of that row's completion after ``prompts``
        (completion width; padding positions arbitrary). Every process runs as many forwards (collective under
        ZeRO-3 / FSDP: a process with fewer rows pads with copies of its first)."""
        policy = self.policy
        n = len(prompts)
        width = max(gather_object([n])) if policy.accelerator.num_processes > 1 else n
        if width == 0:
            return []
        filler = prompts[:1] or [list(output["prompt_ids"][0][output["prompt_mask"][0].bool()].tolist())]
        rows = rows + [rows[0] if rows else 0] * (width - n)
        prompts = prompts + filler * (width - n)
        ids, mask = left_pad(prompts, policy.tokenizer.pad_token_id, policy.accelerator.device)
        completion_ids = output["completion_ids"][rows]
        completion_mask = output["completion_mask"][rows]
        with self.model() as model, torch.no_grad(), torch.random.fork_rng(devices=[]):
            logps = policy.logps(
                model,
                torch.cat([ids, completion_ids], 1),
                torch.cat([mask, completion_mask], 1),
                completion_ids.size(1),
                batch_size=self.args.per_device_train_batch_size,
            )
        return list(logps[:n].float())

    def save(self, folder: Path) -> None:
        """An EMA teacher's own weights into a checkpoint folder (the others are the start model or the policy)."""
        if self.weights is not None and self.scoring.ema:
            torch.save(self.weights.state_dict(), folder / EMA_TEACHER)

    def load(self, folder: Path) -> None:
        """An EMA teacher's weights from a checkpoint folder (a checkpoint without them: from the start model)."""
        if self.weights is None or not self.scoring.ema:
            return
        saved = folder / EMA_TEACHER
        if saved.is_file():
            self.weights.load_state_dict(torch.load(saved, map_location="cpu", weights_only=True))
        else:
            logger.warning("%s holds no EMA teacher: the teacher starts again from the start model.", folder)


class EMATeacher(TrainerCallback):
    """``score_teacher ema``: after each optimizer step the teacher moves ``scoring_rate`` of the way to the policy
    (TRL's ``SyncRefModelCallback`` update, every step)."""

    def __init__(self, teacher, scoring_rate: float) -> None:
        self.teacher, self.rate = teacher, scoring_rate

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if model is not None:
            SyncRefModelCallback.sync_target_model(extract_model_from_parallel(model), self.teacher, self.rate)
