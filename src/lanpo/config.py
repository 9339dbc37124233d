"""``LanpoConfig``: TRL's ``GRPOConfig`` plus the switches of LANPO.

Every field is a dataclass field with a one-line help, so ``lanpo train --help`` lists them and a YAML config
maps one-to-one onto them. Validation runs in ``__post_init__``, before any model is loaded.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import typing
from dataclasses import dataclass, field
from typing import Literal, NamedTuple, get_args

from trl import GRPOConfig

from lanpo.plan import (
    ATTEMPTS,
    COMPOSITION_FREE_LOSSES,
    GROUPINGS,
    HINT_TOP,
    KINDS,
    OBJECTIVES,
    SCORE_SOURCES,
    Attempts,
    FeedbackKind,
    Grouping,
    Objective,
    Scoring,
    StepPlan,
    feedback_sources,
    plan_group,
)

logger = logging.getLogger(__name__)
MAX_CODE_TIMEOUT = 300.0  # seconds of one sandboxed execution (the verifier's bound: lanpo.verify.code)
MAX_CODE_WORKERS = 64  # sandboxes at once (the sandbox's uid range: lanpo.verify.sandbox.MAX_WORKERS)

# Every choice list of LANPO's fields, owned here: `--help` shows them, and __post_init__ checks them.
Schedule = Literal["constant", "linear"]
ReflectionSource = Literal["auto", "step", "pool", "ahead"]
GenerationRounds = Literal["one", "phased"]
Trigger = Literal["always", "unsolved"]
FeedbackSourceName = Literal["self", "reference", "gold", "self-hint", "execution", "sibling"]
FeedbackRoute = Literal["generate", "score", "both"]
ScoreForm = Literal["additive", "contrastive"]
ScoreTeacher = Literal["initial", "live", "ema"]
ScoreRows = Literal["failed", "all"]
ScoreContext = Literal["right", "control"]
HintSchedule = Literal["ladder", "fixed"]
Scorer = Literal["bm25", "embedding", "llm"]
ContextInLoss = Literal["strip", "strip-sequence", "shaped", "unweighted", "keep"]
AdvantageGrouping = Literal["shared", "separate", "scratch-baseline"]
Extraction = Literal["strict", "lenient"]
RetrievalRank = Literal["similarity", "simutil", "lift"]  # lanpo.pool.worth.RANKINGS
PoolEviction = Literal["oldest", "worth"]
LogprobHead = Literal["trl", "compact"]
EVAL_MODES = ("zero-shot", "retrieval")  # evaluation during training (a comma-separated field)
SCHEDULES, REFLECTION_SOURCES, SCORERS = get_args(Schedule), get_args(ReflectionSource), get_args(Scorer)
GENERATION_ROUNDS = get_args(GenerationRounds)
TRIGGERS, FEEDBACK_SOURCES, HINT_SCHEDULES = get_args(Trigger), get_args(FeedbackSourceName), get_args(HintSchedule)
LOGPROB_HEADS = get_args(LogprobHead)
ROUTES, SCORE_FORMS, SCORE_TEACHERS, SCORE_ROWS, SCORE_CONTEXTS = (
    get_args(FeedbackRoute),
    get_args(ScoreForm),
    get_args(ScoreTeacher),
    get_args(ScoreRows),
    get_args(ScoreContext),
)
CONTEXT_IN_LOSS, ADVANTAGE_GROUPING, EXTRACTIONS = (
    get_args(ContextInLoss),
    get_args(AdvantageGrouping),
    get_args(Extraction),
)


@dataclass
class LanpoConfig(GRPOConfig):
    """Configuration for :class:`~lanpo.trainer.LanpoTrainer`: every field of TRL's ``GRPOConfig``, plus LANPO's,
    in four groups (language feedback; the experience pool and retrieval; the loss; reward, outputs and evaluation
    during training). Each field is documented once, by its ``help`` below: ``lanpo train --help`` shows it, and
    docs/reference/config.md is generated from it. Values are checked in ``__post_init__``, before a model loads.
    """

    # -- language feedback -----------------------------------------------------------------------------------
    feedback_ratio: float = field(
        default=0.75,
        metadata={
            "help": "p_t: round(p_t*G) rollouts of each group get feedback (paper: 0.75 best, 1.0 collapses); 0 is "
            "exactly GRPO. lanpo/feedback_share is the realized p_t."
        },
    )
    feedback_schedule: Schedule = field(
        default="constant",
        metadata={"help": "p_t schedule: constant, or linear warm-up from 0 over feedback_warmup_steps."},
    )
    feedback_warmup_steps: int = field(
        default=0, metadata={"help": "Steps over which a linear schedule raises p_t from 0 to feedback_ratio."}
    )
    reflection_share: float = field(
        default=0.5,
        metadata={
            "help": "Share of feedback rollouts that use reward-agnostic reflection; the rest use relevant abstraction."
        },
    )
    feedback_trigger: Trigger = field(
        default="always",
        metadata={
            "help": "always: every group gets round(p_t*G) feedback rows; unsolved: only groups passing at most "
            "feedback_trigger_pass_rate (one: of the problem's stored attempts; phased: of the step's scratch rows, "
            "failed rows then regenerated with feedback)."
        },
    )
    feedback_source: FeedbackSourceName = field(
        default="self",
        metadata={
            "help": "Where feedback rows' contexts come from. self: LANPO's reward-agnostic reflection and relevant "
            "abstraction, label-free. The rest are privileged, shown in training only and read from the data's "
            "worked solutions and gold answers: reference, the first part of the worked solution at a hint level "
            "(UFT, GHPO, QuestA); gold, the model's attempt, 'the generated solution is incorrect, the ground truth "
            "is X', solve again (Critique-GRPO); self-hint, a hint the policy writes from the solution, dropped if "
            "it states the answer (SAGE). sibling (feedback_route score only): a right rollout of the same group "
            "(SDPO), no gold needed. execution (code, not privileged): the model's attempt and what running it on "
            "the examples the problem shows did (RLEF); under feedback_route score, that report alone scores the "
            "row's own attempt."
        },
    )
    feedback_route: FeedbackRoute = field(
        default="generate",
        metadata={
            "help": "How feedback reaches the loss. generate: rows are sampled under the context (LANPO; "
            "context_in_loss says how they are trained). score: every row is a plain rollout, and the policy given "
            "the context (a teacher) only scores them: its per-token log-ratio joins the advantage (SDPO, OPSD, "
            "RLCSD; feedback_source gold, reference, sibling or execution). both: generated rows, and the plain ones "
            "scored."
        },
    )
    score_form: ScoreForm = field(
        default="additive",
        metadata={
            "help": "score: additive, A_t = A + score_coef * clip(log pi_T(y_t|c,x) - log pi_old(y_t|x), "
            "+-score_clip) (SDPO, OPSD); contrastive, the teacher's log-ratio of the right context over "
            "score_wrong_contexts wrong ones in the same template, a clamped tanh residual added to A without "
            "flipping its sign (RLCSD)."
        },
    )
    score_teacher: ScoreTeacher = field(
        default="initial",
        metadata={
            "help": "score: which weights score under the context. initial, the frozen start model (OPSD; the KL "
            "reference when beta > 0, no extra memory); live, the policy itself; ema, a copy moving toward the "
            "policy by score_ema_rate each step (SDPO)."
        },
    )
    score_coef: float = field(
        default=1.0, metadata={"help": "score: lambda, the weight of the teacher's signal (0: exactly GRPO)."}
    )
    score_clip: float = field(
        default=2.0, metadata={"help": "score, additive: the per-token log-ratio is clipped to +-score_clip."}
    )
    score_rows: ScoreRows = field(
        default="failed",
        metadata={"help": "score: which plain rows are scored: failed (the verifier did not credit them), or all."},
    )
    score_context: ScoreContext = field(
        default="right",
        metadata={
            "help": "score: right, the row's own context; control, the same template showing another problem's "
            "answer or solution (a style and compute control for experiments: what scoring does without "
            "information)."
        },
    )
    score_wrong_contexts: int = field(
        default=2,
        metadata={
            "help": "score, contrastive: wrong contexts a row is also scored under (other problems' answers or "
            "solutions of the batch, in the identical template)."
        },
    )
    score_ema_rate: float = field(
        default=0.05, metadata={"help": "score_teacher ema: the teacher moves this share toward the policy a step."}
    )
    hint_level: int = field(
        default=1,
        metadata={
            "help": "reference, self-hint: a problem's first hint level, 1 to 3 (reference: 1/4, 2/4, 3/4 of the "
            "solution's steps, never the last)."
        },
    )
    hint_schedule: HintSchedule = field(
        default="ladder",
        metadata={
            "help": "ladder: a problem's level goes up after a step where at most 10 percent of its hinted rows were right, "
            "down where more than 35 percent were (SAGE's light variant); fixed: stays at hint_level."
        },
    )
    hint_escalation: int = field(
        default=0,
        metadata={
            "help": "reference, self-hint: rounds within a step that re-generate the hinted rows still failing one "
            "level up (GHPO, SAGE), each a generation call of its own after the step's; 0: none."
        },
    )
    hint_anneal_steps: int = field(
        default=0,
        metadata={
            "help": "reference, self-hint: shrink every hint linearly to nothing over this many steps (UFT); 0: never."
        },
    )
    hint_max_length: int = field(
        default=128,
        metadata={
            "help": "self-hint: most new tokens of a hint the policy writes (in a generation call of its own, before the step's)."
        },
    )
    feedback_trigger_pass_rate: float = field(
        default=0.0,
        metadata={"help": "unsolved: a group is triggered when at most this share of what it reads is right."},
    )
    feedback_max_completion_length: int | None = field(
        default=None,
        metadata={
            "help": "Most new tokens of a feedback row (its analysis comes before the solution); default "
            "max_completion_length."
        },
    )
    reflection_source: ReflectionSource = field(
        default="auto",
        metadata={
            "help": "Which own attempts reflection, gold and execution rows show. auto and ahead: the newest stored "
            "(the next step's problems attempted a step early); pool: stored only. Under generation_rounds phased, "
            "auto and step also reflect on this step's (a second call)."
        },
    )
    generation_rounds: GenerationRounds = field(
        default="one",
        metadata={
            "help": "one: a step's rows, feedback contexts built from what is known before it (attempts stored a "
            "step or more earlier, the pool, their execution reports and verifier scores: unsolved triggers on "
            "those), riding summaries and the next step's plain attempts in one generation call; a row with nothing "
            "to show goes plain. phased: the older arrangement (a second call for contexts on this step's attempts; "
            "unsolved regenerates failed rows; p_t 0 summaries apart). hint_escalation and self-hint add calls."
        },
    )

    # -- experience pool and retrieval -----------------------------------------------------------------------
    pool_cap: int = field(default=32, metadata={"help": "Pool entries kept per problem (oldest evicted)."})
    pool_attempts_cap: int = field(default=4, metadata={"help": "Raw attempts kept per problem for reflection."})
    summaries_per_group: int = field(
        default=1,
        metadata={"help": "Trials per group distilled into pool entries each step (right and wrong alternate)."},
    )
    summary_max_length: int = field(
        default=256,
        metadata={
            "help": "Most new tokens of one pool summary: it rides in the next rollout batches until it ends or "
            "reaches this (summaries/carried)."
        },
    )
    relevance_scorer: Scorer = field(
        default="llm",
        metadata={
            "help": "Relevance score in [0, 1] of a retrieved entry: llm (the policy's P(Yes) to 'would these "
            "lessons help?'), embedding (cosine; the embed extra), bm25 (normalized)."
        },
    )
    relevance_threshold: float = field(
        default=0.9, metadata={"help": "γ: entries whose relevance is below it are never shown (paper: 0.9)."}
    )
    retrieval_top_k: int = field(default=3, metadata={"help": "Most pool entries in one abstraction prompt."})
    retrieval_candidates: int = field(default=16, metadata={"help": "BM25 candidates scored for relevance."})
    retrieval_rank: RetrievalRank = field(
        default="similarity",
        metadata={
            "help": "How retrieved entries are ranked: similarity (relevance alone); simutil (RetroAgent's SimUtil-UCB: "
            "0.6 relevance + 0.4 (success EMA + UCB bonus), relevance floor 0.4 instead of gamma); lift (each "
            "entry's in-group lift, shrunk, by its upper bound; entries judged harmful are not shown). Under "
            "simutil and lift each abstraction row is shown one lesson, so its credit is exact."
        },
    )
    pool_eviction: PoolEviction = field(
        default="oldest",
        metadata={
            "help": "Which entries leave a problem's pool at pool_cap (and the whole pool at pool_total_cap): oldest, "
            "or worth (first entries judged not to help, lowest lift first; then the oldest of those too young to "
            "judge; an entry judged to help last)."
        },
    )
    pool_total_cap: int = field(
        default=0, metadata={"help": "Entries kept in the whole pool (0: no cap beyond pool_cap per problem)."}
    )
    embedding_model: str | None = field(
        default=None,
        metadata={
            "help": "sentence-transformers model for relevance_scorer=embedding (default: bundled all-MiniLM-L6-v2)."
        },
    )

    # -- loss ------------------------------------------------------------------------------------------------
    context_in_loss: ContextInLoss = field(
        default="strip",
        metadata={
            "help": "How a feedback row (sampled under x + c) reaches the loss. On pi(y|x), the zero-shot policy, at "
            "GRPO's update cost: strip, with a per-token weight pi(y|x)/pi(y|x,c) truncated at strip_ratio_clip "
            "(Guide-GRPO); strip-sequence, with the row's geometric-mean weight (GSPO-style: it weighs the state); "
            "shaped, with no weight, f(pi) = pi/(pi+shaping_gamma) and no clip (LUFFY, Critique-GRPO); unweighted, "
            "with the plain advantage (RLTF-SD). keep: train pi(y|x,c) (SAGE, QuestA; every forward pays for the "
            "context). Feedback rows of the first four get their own KL (importance-weighted r^2/2, finite for any "
            "r): kl/scratch and kl/feedback are logged beside kl."
        },
    )
    strip_ratio_clip: float = field(
        default=2.0,
        metadata={
            "help": "strip, strip-sequence (and the feedback rows' KL weight): upper bound of pi(y|x)/pi(y|x,c)."
        },
    )
    shaping_gamma: float = field(
        default=0.1,
        metadata={"help": "shaped: gamma of the policy shaping f(pi) = pi/(pi+gamma) on feedback tokens (LUFFY: 0.1)."},
    )
    advantage_grouping: AdvantageGrouping = field(
        default="shared",
        metadata={
            "help": "shared: one advantage group of G; separate: feedback and scratch rollouts normalized apart; "
            "scratch-baseline: feedback rollouts centred on the scratch rollouts' mean (scaled by the group's std), "
            "scratch rollouts among themselves (RLTF-SD)."
        },
    )

    logprob_head: LogprobHead = field(
        default="trl",
        metadata={
            "help": "How the loss, reference and old-policy passes compute per-token log-probabilities. trl: TRL's "
            "fused LM head (on a device without Triton it projects every position, prompt and padding too); "
            "compact: the head on completion tokens only, 512 at a time, torch's log_softmax: 1.8x faster a "
            "forward and backward of the update on CPU (benchmarks/step_floor.py), values within about 1e-6 "
            "relative of trl's, one chunk's log-softmax kept for the backward."
        },
    )

    old_logps_from_loss: bool = field(
        default=False,
        metadata={
            "help": "Under vLLM's importance-sampling correction TRL runs a no-grad forward of every generation batch "
            "for pi_old. Where no optimizer step falls between a generation and its loss (gradient_accumulation_steps "
            "a multiple of steps_per_generation x num_iterations), pi_old is the loss forward's own detached value: "
            "take it there and correct in the loss, one forward a step fewer; values equal to rounding."
        },
    )

    # -- reward ----------------------------------------------------------------------------------------------
    answer_extraction: Extraction = field(
        default="strict",
        metadata={
            "help": "strict: the final \\boxed{} only; lenient: else 'the answer is X', else the last number not "
            "copied from the problem (for models that rarely box; hackable)."
        },
    )
    verify_time_limit: float = field(
        default=2.0,
        metadata={"help": "Seconds one answer may take to verify before it scores 0 (worker process is replaced)."},
    )
    code_timeout: float = field(
        default=5.0,
        metadata={
            "help": "Code problems: wall-clock seconds one sandboxed execution of a completion's code and its tests "
            "may take (CPU time is limited to the same); past it the sandbox is killed and the row scores 0."
        },
    )
    code_workers: int = field(
        default=2, metadata={"help": "Code problems: sandboxed executions run at once (one per core is a good start)."}
    )
    code_partial_credit: bool = field(
        default=False,
        metadata={"help": "Code problems: reward the share of test cases passed instead of 1 only when all pass."},
    )
    allow_unsandboxed_code: bool = field(
        default=False,
        metadata={
            "help": "Run model-written code WITHOUT bubblewrap when it is missing: resource limits only, NO security "
            "boundary (the code can read and write your files and reach the network). Off: lanpo refuses."
        },
    )

    # -- run outputs -----------------------------------------------------------------------------------------
    log_samples: int = field(
        default=8,
        metadata={
            "help": "Rollouts per step written to samples.jsonl (prompt, completion, kind, reward): whole groups, at "
            "least one."
        },
    )

    # -- evaluation during training --------------------------------------------------------------------------
    eval_benchmarks: str | None = field(
        default=None,
        metadata={
            "help": "Held-out problems evaluated during training, comma-separated data specs (math500, aime24, gsm8k, "
            "builtin:arith?split=test, a file); logged as eval/<benchmark>/<mode>/mean@k. Unset with "
            "eval_every > 0 under lanpo train: the training data's held-out split (builtin:arith's test split, "
            "gsm8k's test split, math500 for math)."
        },
    )
    eval_modes: str = field(
        default="zero-shot",
        metadata={
            "help": "Evaluation modes during training, comma-separated: zero-shot, retrieval (from this run's pool)."
        },
    )
    eval_every: int = field(
        default=0, metadata={"help": "Evaluate before the first step and every N steps (0: never)."}
    )
    eval_k: int = field(default=4, metadata={"help": "Samples per held-out problem (mean@k)."})
    eval_limit: int | None = field(
        default=128, metadata={"help": "Held-out problems per benchmark (the first N); empty for all."}
    )

    def __post_init__(self) -> None:
        self._check_lanpo_fields()
        super().__post_init__()
        per_process = self.per_device_train_batch_size * self.steps_per_generation
        if per_process % self.num_generations != 0:
            raise ValueError(
                f"per_device_train_batch_size × steps_per_generation ({self.per_device_train_batch_size} × "
                f"{self.steps_per_generation} = {per_process}) must be a multiple of num_generations "
                f"({self.num_generations}), so that every process holds whole groups (LANPO builds a group's "
                "feedback from that group's own rollouts)."
            )
        if self.feedback_ratio > 0 and self.use_liger_kernel:
            raise ValueError(
                f"context_in_loss={self.context_in_loss} changes GRPOTrainer's own loss on feedback rows "
                "(weights, shaping, their KL); the Liger kernel loss bypasses it: set use_liger_kernel "
                "false or feedback_ratio 0."
            )
        if self.summaries_per_group > self.num_generations:
            raise ValueError(
                f"summaries_per_group ({self.summaries_per_group}) cannot exceed num_generations "
                f"({self.num_generations})."
            )
        if self.generation_rounds == "one" and self.reflection_source == "step" and self.feedback_ratio > 0:
            raise ValueError(
                "reflection_source step reflects on this step's own scratch rollouts, which needs a second generation "
                "call after them: set generation_rounds phased, or reflection_source auto (the newest stored attempt, "
                "written a step earlier)."
            )
        plan = plan_group(self.num_generations, self.feedback_ratio, self.reflection_share)
        reflections = plan.rows_of("reflection")
        if plan.scratch == 0 and reflections and self.reflection_source != "pool":
            until = {
                "step": "in every step: reflection_source step reflects only on this step's scratch rollouts",
                "ahead": "in the first step (later problems get attempts a step ahead)",
            }.get(self.reflection_source, "until every problem has attempts in the pool (after the first epoch)")
            if self.generation_rounds == "one":
                until = "in the first step (later problems get attempts a step ahead)"
            logger.warning(
                "feedback_ratio %s leaves no scratch rollouts in a group of %d: a problem with no stored attempts "
                "has nothing of its own to reflect on, so its %d reflection rows fall back to the plain prompt, and "
                "the realized p_t (lanpo/feedback_share) stays below %s %s.",
                self.feedback_ratio,
                self.num_generations,
                reflections,
                self.feedback_ratio,
                until,
            )

        self._warn_options_that_do_nothing()
        if (
            self.reflection_source == "ahead"
            and self.feedback_trigger != "always"
            and self.generation_rounds == "phased"
        ):
            logger.warning(
                "reflection_source ahead attempts the next step's problems for feedback_trigger always only: with %s "
                "a reflection shows its group's failed attempts of the step, and nothing is attempted ahead.",
                self.feedback_trigger,
            )

    def _warn_options_that_do_nothing(self) -> None:
        """Options the combination given leaves without effect: said once, so nobody reads a result as theirs."""
        idle = []
        if self.reflection_source == "ahead" and self.feedback_ratio == 0:
            idle.append("reflection_source ahead does nothing with feedback_ratio 0 (no feedback rows)")
        kind = self.feedback_kind
        reads_attempts = self.feedback_source == "self" or (
            self.generation_rounds == "one" and kind is not None and kind.reads_attempts
        )
        if self.reflection_source == "ahead" and not reads_attempts:
            idle.append(
                f"reflection_source ahead does nothing with feedback_source {self.feedback_source} (its rows show "
                "no attempt of the problem's own)"
            )
        if self.feedback_trigger == "always" and self.feedback_trigger_pass_rate != 0.0:
            idle.append("feedback_trigger_pass_rate does nothing under feedback_trigger always")
        for line in idle:
            logger.warning("%s.", line)

    def _check_lanpo_fields(self) -> None:
        check_finite(self)
        check_whole_numbers(self)

        def choice(name: str, options: tuple[str, ...]) -> None:
            if getattr(self, name) not in options:
                raise ValueError(f"{name} must be one of {', '.join(options)}; got {getattr(self, name)!r}.")

        if self.num_generations is None or isinstance(self.num_generations, bool):
            raise ValueError(f"num_generations (G) must be an integer >= 2, got {self.num_generations!r}.")
        if self.output_dir is not None and not str(self.output_dir).strip():
            raise ValueError("output_dir is empty: name the folder the run writes to.")
        if self.num_generations < 2:
            raise ValueError(
                f"num_generations (G) must be >= 2, got {self.num_generations}: GRPO and LANPO compare "
                "rollouts within a group of G."
            )
        choice("feedback_schedule", SCHEDULES)
        choice("feedback_trigger", TRIGGERS)
        choice("feedback_source", feedback_sources())  # FEEDBACK_SOURCES and any kind registered since
        choice("feedback_route", ROUTES)
        choice("score_form", SCORE_FORMS)
        choice("score_teacher", SCORE_TEACHERS)
        choice("score_rows", SCORE_ROWS)
        choice("score_context", SCORE_CONTEXTS)
        self._check_scoring()
        choice("hint_schedule", HINT_SCHEDULES)
        if not 1 <= self.hint_level <= HINT_TOP:
            raise ValueError(f"hint_level must be 1 to {HINT_TOP}, got {self.hint_level}.")
        for name in ("hint_escalation", "hint_anneal_steps"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}.")
        if self.hint_max_length < 1:
            raise ValueError(f"hint_max_length must be >= 1, got {self.hint_max_length}.")
        if self.feedback_max_completion_length is not None and self.feedback_max_completion_length < 1:
            raise ValueError(
                f"feedback_max_completion_length must be >= 1 (or unset), got {self.feedback_max_completion_length}."
            )
        choice("reflection_source", REFLECTION_SOURCES)
        choice("generation_rounds", GENERATION_ROUNDS)
        choice("relevance_scorer", SCORERS)
        choice("retrieval_rank", get_args(RetrievalRank))
        choice("pool_eviction", get_args(PoolEviction))
        if self.pool_total_cap < 0:
            raise ValueError(f"pool_total_cap must be >= 0 (0: no whole-pool cap), got {self.pool_total_cap}.")
        choice("context_in_loss", CONTEXT_IN_LOSS)
        choice("advantage_grouping", ADVANTAGE_GROUPING)
        choice("logprob_head", LOGPROB_HEADS)
        if self.answer_extraction == "boxed":  # the old name of strict
            self.answer_extraction = "strict"
        choice("answer_extraction", EXTRACTIONS)
        if self.feedback_schedule == "linear" and self.feedback_warmup_steps <= 0:
            raise ValueError("feedback_schedule=linear needs feedback_warmup_steps > 0.")
        if self.feedback_warmup_steps < 0:
            raise ValueError(f"feedback_warmup_steps must be >= 0, got {self.feedback_warmup_steps}.")
        for name in ("pool_cap", "pool_attempts_cap", "retrieval_top_k", "summary_max_length"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}.")
        if self.summaries_per_group < 0:
            raise ValueError(f"summaries_per_group must be >= 0, got {self.summaries_per_group}.")
        if self.retrieval_candidates < self.retrieval_top_k:
            raise ValueError(
                f"retrieval_candidates ({self.retrieval_candidates}) must be >= retrieval_top_k "
                f"({self.retrieval_top_k})."
            )
        if not self.shaping_gamma > 0:
            raise ValueError(f"shaping_gamma must be > 0, got {self.shaping_gamma}.")
        if self.advantage_grouping == "scratch-baseline" and self.multi_objective_aggregation != "sum_then_normalize":
            raise ValueError(
                "advantage_grouping=scratch-baseline baselines the summed reward: set "
                "multi_objective_aggregation sum_then_normalize (or use separate)."
            )
        if self.objective.strips_context and self.use_vllm:
            self._check_vllm_logprobs_match_the_trainer()
        if self.eval_every < 0 or self.eval_k < 1 or (self.eval_limit is not None and self.eval_limit < 1):
            raise ValueError(
                f"eval_every must be >= 0 and eval_k, eval_limit >= 1; got {self.eval_every}, "
                f"{self.eval_k}, {self.eval_limit}."
            )
        modes = self.eval_mode_list()
        if not modes or any(m not in EVAL_MODES for m in modes):
            raise ValueError(f"eval_modes must list zero-shot and/or retrieval, got {self.eval_modes!r}.")
        if not 1 <= self.code_workers <= MAX_CODE_WORKERS:
            raise ValueError(
                f"code_workers must be a whole number from 1 to {MAX_CODE_WORKERS}, got {self.code_workers!r}."
            )
        if len(set(modes)) != len(modes):
            raise ValueError(f"eval_modes names a mode twice: {self.eval_modes!r}.")
        for name in ("max_completion_length", "per_device_train_batch_size", "gradient_accumulation_steps"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}.")
        if self.max_steps == 0 or self.max_steps < -1:
            raise ValueError(f"max_steps must be -1 (use num_train_epochs) or >= 1, got {self.max_steps}.")
        check_float_ranges(self)  # every float field's range (FLOAT_RANGES): one check, named by field

    def _check_scoring(self) -> None:
        if self.feedback_route == "generate":
            if self.feedback_source == "sibling":
                raise ValueError(
                    "feedback_source sibling scores plain rows with a right rollout of their group: it needs "
                    "feedback_route score (there is no sibling row to generate under)."
                )
            return
        if self.feedback_source not in SCORE_SOURCES:
            raise ValueError(
                f"feedback_route {self.feedback_route} scores rows under a context from {', '.join(SCORE_SOURCES)}; "
                f"feedback_source {self.feedback_source} writes its contexts by generating (use feedback_route "
                "generate)."
            )
        if self.feedback_route == "both" and self.feedback_source == "sibling":
            raise ValueError("feedback_route both generates rows under feedback_source; sibling can only score.")
        if not 1 <= self.score_wrong_contexts <= 8:
            raise ValueError(f"score_wrong_contexts must be 1 to 8, got {self.score_wrong_contexts}.")

    @property
    def scoring(self) -> Scoring | None:
        """``feedback_route`` and the ``score_*`` fields decoded (None: nothing is scored, the step is GRPO's or
        LANPO's generated route)."""
        if self.feedback_route == "generate" or self.score_coef == 0:
            return None
        return Scoring(
            source=self.feedback_source,
            form=self.score_form,
            teacher=self.score_teacher,
            coef=self.score_coef,
            clip=self.score_clip,
            rows=self.score_rows,
            level=self.hint_level,
            wrong=self.score_wrong_contexts,
            control=self.score_context == "control",
        )

    @property
    def feedback_kind(self) -> FeedbackKind | None:
        """The feedback row kind ``feedback_source`` names (None: ``self``, whose kinds are several, or ``sibling``,
        which only scores)."""
        return KINDS.get(self.feedback_source) if self.feedback_source != "self" else None

    @property
    def generated_kinds(self) -> tuple[str, ...]:
        """The kinds of feedback rows this run generates (their sources are built): none under
        ``feedback_route score``, ``self``'s kinds, or the one kind named."""
        if self.feedback_route == "score":
            return ()
        if self.feedback_source == "self":
            return tuple(k for k, kind in KINDS.items() if kind.joins_self)
        return (self.feedback_source,)

    def old_logps_apply(self, use_vllm: bool) -> bool:
        """``old_logps_from_loss`` applies: vLLM's correction is on and no optimizer step falls between a generation
        and its loss, so π_old is the loss forward's own (detached) value."""
        every = self.steps_per_generation * self.num_iterations
        on = self.old_logps_from_loss and use_vllm and self.vllm_importance_sampling_correction
        return on and self.gradient_accumulation_steps % every == 0

    def warn_if_old_logps_idle(self, use_vllm: bool) -> None:
        """Say why ``old_logps_from_loss`` has no effect, where it is asked for and does not apply."""
        if not self.old_logps_from_loss or self.old_logps_apply(use_vllm):
            return
        logger.warning(
            "old_logps_from_loss has no effect here: %s",
            "TRL runs no old-policy pass without vLLM's importance correction"
            if not (use_vllm and self.vllm_importance_sampling_correction)
            else "an optimizer step falls between a generation and its loss (gradient_accumulation_steps is not a "
            "multiple of steps_per_generation x num_iterations), so pi_old needs its own pass",
        )

    @property
    def runs_public_examples(self) -> bool:
        """Whether feedback runs attempts on their problems' public examples (``feedback_source execution``)."""
        return self.feedback_source == "execution"

    @property
    def attempts_ahead(self) -> bool:
        """Whether a step may attempt the next step's problems in its own call (the trainer then pulls the next
        step's batches a step early): under ``generation_rounds one`` with a reflection_source that reads more than
        stored attempts, or ``reflection_source ahead``; never without feedback rows."""
        reads_ahead = self.attempts.ahead or (self.generation_rounds == "one" and self.attempts.this_step)
        return self.feedback_ratio > 0 and reads_ahead

    @property
    def attempts(self) -> Attempts:
        """``reflection_source`` decoded: which of its own attempts a reflection row may show."""
        return ATTEMPTS[self.reflection_source]

    @property
    def grouping(self) -> Grouping:
        """``advantage_grouping`` decoded: which rows form a row's baseline."""
        return GROUPINGS[self.advantage_grouping]

    @property
    def adaptive_hints(self) -> bool:
        """``hint_schedule ladder``: a problem's hint level moves with its outcomes (else it stays at hint_level)."""
        return self.hint_schedule == "ladder"

    @property
    def compact_logprob_head(self) -> bool:
        """``logprob_head compact``: log-probabilities from the sampled tokens' rows of the head only."""
        return self.logprob_head == "compact"

    @property
    def objective(self) -> Objective:
        """``context_in_loss`` decoded: how feedback rows reach the loss (the one place the string is read)."""
        return OBJECTIVES[self.context_in_loss]

    def _check_vllm_logprobs_match_the_trainer(self) -> None:
        """The strip family compares π(y|x,c) from the sampler with π(y|x) from TRL's forward (logits / T). vLLM
        reports its processed log-probabilities, which differ from that whenever a sampling setting reshapes the
        distribution: refuse those settings here rather than bias every weight."""
        settings = {
            "top_p": self.top_p if self.top_p < 1.0 else None,
            "top_k": self.top_k if self.top_k else None,
            "min_p": self.min_p,
            "repetition_penalty": self.repetition_penalty if self.repetition_penalty != 1.0 else None,
        }
        settings.update(
            {
                f"generation_kwargs.{k}": v
                for k, v in (self.generation_kwargs or {}).items()
                if k
                in (
                    "top_p",
                    "top_k",
                    "min_p",
                    "repetition_penalty",
                    "presence_penalty",
                    "frequency_penalty",
                    "logit_bias",
                    "bad_words",
                    "allowed_token_ids",
                    "min_tokens",
                )
            }
        )
        reshaping = {k: v for k, v in settings.items() if v is not None}
        if reshaping:
            raise ValueError(
                f"context_in_loss={self.context_in_loss} with use_vllm needs vLLM's log-probabilities to be "
                f"log_softmax(logits / temperature), as TRL's training forward computes them; {reshaping} reshape "
                "vLLM's reported values. Unset them, or use context_in_loss keep."
            )

    def eval_mode_list(self) -> list[str]:
        return [m.strip() for m in self.eval_modes.split(",") if m.strip()]

    def feedback_ratio_at(self, step: int) -> float:
        """p_t at optimizer step ``step`` under the configured schedule."""
        if self.feedback_schedule == "linear":
            return self.feedback_ratio * min(1.0, step / self.feedback_warmup_steps)
        return self.feedback_ratio

    def step_plan(self, step: int) -> StepPlan:
        """The plan of optimizer step ``step``: built once, when its generation batch starts (``LanpoTrainer``)."""
        generated = self.feedback_route != "score"  # under score every row is a plain rollout
        group = plan_group(
            self.num_generations,
            self.feedback_ratio_at(step) if generated else 0.0,
            self.reflection_share,
            self.feedback_source,
        )
        objective = self.objective
        # Sorting rows by prompt length changes which rows share a micro-batch: only where that leaves the loss and
        # its gradients unchanged (one optimizer step per generation, a loss whose normalization ignores it).
        buckets = (
            objective.keeps_context
            and group.feedback > 0
            and self.steps_per_generation > 1
            and self.steps_per_generation == self.gradient_accumulation_steps
            and self.loss_type in COMPOSITION_FREE_LOSSES
            and not (self.entropy_coef != 0.0 or self.use_adaptive_entropy)
        )
        return StepPlan(
            step=step,
            feedback_ratio=self.feedback_ratio_at(step),
            group=group,
            trigger=self.feedback_trigger,
            trigger_pass_rate=self.feedback_trigger_pass_rate,
            objective=objective,
            bucket_by_prompt_length=buckets,
            hint_escalation=self.hint_escalation,
            hint_scale=self.hint_scale_at(step),
            scoring=self.scoring,
            one_round=self.generation_rounds == "one",
        )

    def hint_scale_at(self, step: int) -> float:
        """The share of a hint kept at optimizer step ``step``: 1, or under hint_anneal_steps falling linearly to 0."""
        if not self.hint_anneal_steps:
            return 1.0
        return max(0.0, 1.0 - step / self.hint_anneal_steps)


class Range(NamedTuple):
    """Where a float setting trains on something finite: ``low`` to ``high``, each end excluded where open."""

    low: float
    high: float
    open_low: bool = False
    open_high: bool = False

    def holds(self, value: float) -> bool:
        above = value > self.low if self.open_low else value >= self.low
        below = value < self.high if self.open_high else value <= self.high
        return above and below

    def __str__(self) -> str:
        return f"{'(' if self.open_low else '['}{self.low:g}, {self.high:g}{')' if self.open_high else ']'}"


# Every float field of LanpoConfig (TRL's and transformers' included) has a range: past it a run trains on nothing
# finite (a step size, a weight or a clip of 1e300 overflows fp32 within a step, or a schedule of 1e300 steps never
# moves) or means nothing (a negative temperature). Fields not named here get DEFAULT_RANGE.
DEFAULT_RANGE = Range(0.0, 1e6)
FLOAT_RANGES: dict[str, Range] = {
    # LANPO's own
    "feedback_ratio": Range(0.0, 1.0),
    "reflection_share": Range(0.0, 1.0),
    "relevance_threshold": Range(0.0, 1.0),
    "feedback_trigger_pass_rate": Range(0.0, 1.0),
    "score_coef": Range(0.0, 100.0),  # the teacher's signal past 100x the reward's advantage (about +-1) drowns it
    "score_clip": Range(0.0, 50.0, open_low=True),  # a log-ratio of 50 is a probability ratio of 5e21
    "score_ema_rate": Range(0.0, 1.0, open_low=True),
    "strip_ratio_clip": Range(0.0, 1e6, open_low=True),  # 1e6: unclipped in practice, still finite in fp32
    "shaping_gamma": Range(0.0, 100.0, open_low=True),
    "verify_time_limit": Range(0.0, 3600.0, open_low=True),
    "code_timeout": Range(0.0, MAX_CODE_TIMEOUT, open_low=True),  # lanpo.verify.code.CodeSettings: the same
    # TRL's GRPOConfig and transformers' TrainingArguments
    "learning_rate": Range(0.0, 1.0, open_low=True),
    "num_train_epochs": Range(0.0, 1e6, open_low=True),
    "warmup_steps": Range(0.0, 1e7),
    "weight_decay": Range(0.0, 10.0),
    "adam_beta1": Range(0.0, 1.0, open_high=True),
    "adam_beta2": Range(0.0, 1.0, open_high=True),
    "adam_epsilon": Range(0.0, 1.0, open_low=True),
    "label_smoothing_factor": Range(0.0, 1.0, open_high=True),
    "neftune_noise_alpha": Range(0.0, 1e3),
    "temperature": Range(0.0, 100.0, open_low=True),
    "top_p": Range(0.0, 1.0, open_low=True),
    "min_p": Range(0.0, 1.0),
    "repetition_penalty": Range(0.0, 100.0, open_low=True),
    "vllm_gpu_memory_utilization": Range(0.0, 1.0, open_low=True),
    "beta": Range(0.0, 1e3),
    "epsilon": Range(0.0, 100.0),
    "epsilon_high": Range(0.0, 100.0),
    "delta": Range(0.0, 1e3),
    "ref_model_mixup_alpha": Range(0.0, 1.0),
    "top_entropy_quantile": Range(0.0, 1.0),
    "entropy_coef": Range(0.0, 1e3),
    "entropy_coef_min": Range(0.0, 1e3),
    "entropy_coef_max": Range(0.0, 1e3),
    "reward_weights": Range(-1e6, 1e6),  # a negative weight penalizes a reward: meaningful
}


def float_fields(settings) -> list[str]:
    """The fields of a settings dataclass declared as floats (alone, optional or in a list)."""
    hints = typing.get_type_hints(type(settings))
    return [f.name for f in dataclasses.fields(settings) if "float" in str(hints.get(f.name, ""))]


def check_float_ranges(settings) -> None:
    """Every float field within its :data:`FLOAT_RANGES` range (refused by name, with the range, before a model
    loads: a value past it trains nothing finite)."""
    for name in float_fields(settings):
        value = getattr(settings, name, None)
        values = value if isinstance(value, list | tuple) else [value]
        allowed = FLOAT_RANGES.get(name, DEFAULT_RANGE)
        for item in values:
            if isinstance(item, bool) or not isinstance(item, int | float):
                continue
            if not allowed.holds(item):
                raise ValueError(
                    f"{name} must be in {allowed}, got {value!r}: past that range a run trains on nothing finite "
                    "or the setting means nothing."
                )


def check_whole_numbers(settings) -> None:
    """Every field LANPO declares as an integer holds one: YAML's ``2.5``, ``2.0`` and ``true`` are refused by name
    (a hint level of 2.5 would be a share between levels; ``true`` is an int to Python)."""
    own = vars(type(settings)).get("__annotations__", {})
    for name, declared in own.items():
        kinds = {part.strip() for part in str(declared).split("|")}
        if "int" not in kinds:
            continue
        value = getattr(settings, name, None)
        if value is None and "None" in kinds:
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{name} must be a whole number, got {value!r}.")


def check_finite(settings) -> None:
    """Every number a dataclass of settings holds (lists included) is finite: nan and inf pass every comparison
    check (nan > 0 is False, so is nan <= 0) and would train on garbage, so they are refused by name here."""
    for f in dataclasses.fields(settings):
        value = getattr(settings, f.name, None)
        values = value if isinstance(value, list | tuple) else [value]
        bad = [v for v in values if isinstance(v, float) and not math.isfinite(v)]
        if bad:
            raise ValueError(f"{f.name} must be a finite number, got {value!r}.")
