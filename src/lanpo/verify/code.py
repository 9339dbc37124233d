"""Code answers: extract the program a completion wrote, run it against the problem's tests in the sandbox.

Extraction mirrors math's two modes:

* ``strict`` — the last fenced block marked ``python`` (or ``py``, or unmarked);
* ``lenient`` — the last fenced block of any kind, an unclosed last fence (a completion cut at the token limit),
  else the code as written: from the first line that starts a definition or import to the end.

:class:`CodeVerifier` has the batch API of :class:`lanpo.verify.rewards.MathVerifier` (``score_texts``, ``stats``,
``close``); :class:`Verifier` sends each gold to the checker of its kind, so training, evaluation and the SFT
builder use one object for math and code alike.
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from lanpo.verify.answers import extraction_mode
from lanpo.verify.sandbox import CodeTests, GoldKind, Limits, Sandbox, check_workers

# A fence of three or more backticks, closed by the first run of as many (three: the first ``` anywhere, as models
# write them; longer: what :func:`fenced` writes around code that holds shorter runs).
FENCE = re.compile(r"(`{3,})[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)\1", re.DOTALL)
OPEN_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*)\Z", re.DOTALL)
CODE_START = re.compile(r"^(?:def|class|import|from|async\s+def)\s", re.MULTILINE)
PYTHON_TAGS = {"python", "py", "python3", ""}
MAX_TIMEOUT = 300.0  # seconds of one execution: past this a test suite is data gone wrong, not a slow machine
MAX_CODE_CHARS = 20_000
logger = logging.getLogger(__name__)


def extract_code(text: str, mode: str = "strict") -> str | None:
    """The program in a completion, or None (see the module docstring for the two modes)."""
    if not isinstance(text, str) or not text.strip():
        return None
    blocks = FENCE.findall(text)
    python = [body for _, tag, body in blocks if tag.lower() in PYTHON_TAGS]
    if python:
        return _clean(python[-1])
    if mode == "strict":
        return None
    if blocks:
        return _clean(blocks[-1][2])
    tail = text[text.rfind("```") :] if "```" in text else None
    if tail is not None and (unclosed := OPEN_FENCE.match(tail)):
        return _clean(unclosed.group(2))
    start = CODE_START.search(text)
    return _clean(text[start.start() :]) if start else None


def fenced(code: str, tag: str = "python") -> str:
    """``code`` in a Markdown fence one backtick longer than its longest run of backticks, at least three
    (CommonMark's rule): nothing inside closes it, and :func:`extract_code` reads the code back whole."""
    longest = max((len(run) for run in re.findall(r"`+", code)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}{tag}\n{code.strip(chr(10))}\n{fence}"


def _clean(code: str) -> str | None:
    code = code.strip("\n")
    if not code.strip() or len(code) > MAX_CODE_CHARS:
        return None
    return code + "\n"


@dataclass(frozen=True)
class CodeSettings:
    """How code rewards run: per-execution limits, parallel sandboxes, partial credit, and the explicit opt-out of
    the sandbox (no security boundary)."""

    timeout: float = 5.0
    workers: int = 2
    partial_credit: bool = False
    allow_unsandboxed: bool = False

    def __post_init__(self) -> None:
        timeout_ok = not isinstance(self.timeout, bool) and isinstance(self.timeout, int | float)
        if not timeout_ok or not 0 < self.timeout <= MAX_TIMEOUT:
            raise ValueError(f"code_timeout must be seconds in (0, {MAX_TIMEOUT:g}], got {self.timeout!r}.")
        check_workers(self.workers)


def code_settings(options) -> CodeSettings:
    """How code rewards run, from a run's options (``code_timeout``, ``code_workers``, ``code_partial_credit``,
    ``allow_unsandboxed_code``): the one place training, evaluation during training and ``lanpo eval`` build them
    (``lanpo eval`` has no partial credit: a problem's rollout passes every test or scores 0)."""
    return CodeSettings(
        options.code_timeout,
        options.code_workers,
        getattr(options, "code_partial_credit", False),
        options.allow_unsandboxed_code,
    )


RUNS_SHARE = 0.5  # of the memory free beside the model's weights and optimizer state: the rest is for activations


def mem_available_mb() -> float | None:
    """The memory the machine has free now (MemAvailable), None where the kernel does not say."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def workers_that_fit(workers: int, run_mb: int, reserved_mb: float, available_mb: float) -> int:
    """How many sandboxes may run at once: ``workers``, lowered so that their bounds together stay within
    :data:`RUNS_SHARE` of what is free beside the model (``available_mb - reserved_mb``). Refuses (ValueError,
    naming the numbers) where not even one fits."""
    room = available_mb - reserved_mb
    fit = int(room * RUNS_SHARE // run_mb) if room > 0 else 0
    if fit < 1:
        raise ValueError(
            f"Not even one code sandbox fits beside the model: {available_mb:,.0f} MB free, about {reserved_mb:,.0f} "
            f"MB for the model's weights and optimizer state, and one sandboxed run may take {run_mb} MB (of the "
            f"{room:,.0f} MB left, at most {RUNS_SHARE:.0%} goes to sandboxes). Free memory, or use a smaller model."
        )
    return min(workers, fit)


def fit_code_workers(workers: int, weights_bytes: int, copies: int, run_mb: int = Limits.memory_mb) -> int:
    """``code_workers`` checked against the memory this machine has free now, before the model loads: the model
    takes ``copies`` times its weights (4 to train with Adam: weights, gradients, two moments; one more for a KL
    reference; 1 to evaluate). A setting whose sandboxes could exhaust the rest is lowered, with a warning naming
    the numbers (how many run at once changes the speed, never a reward); one where a single sandbox cannot fit
    is refused."""
    available = mem_available_mb()
    if available is None:
        return workers
    reserved = weights_bytes / (1024 * 1024) * copies
    allowed = workers_that_fit(workers, run_mb, reserved, available)
    if allowed < workers:
        logger.warning(
            "code_workers lowered from %d to %d: %d sandboxes of %d MB each could take %d MB, and this machine has "
            "%.0f MB free, about %.0f MB of them for the model (its weights x %d); sandboxes get at most %.0f%% of "
            "the rest, the other part is for activations and generation.",
            workers,
            allowed,
            workers,
            run_mb,
            workers * run_mb,
            available,
            reserved,
            copies,
            RUNS_SHARE * 100,
        )
    return allowed


class CodeVerifier:
    """Scores completions against :class:`CodeTests` golds: 1.0 when every test passes (with ``partial_credit``,
    the share of cases passed), 0.0 on any failure, timeout, crash or missing code. Never raises for what the
    code does; a gold that is not a test suite scores 0 and is counted."""

    def __init__(self, settings: CodeSettings | None = None, extraction: str = "strict") -> None:
        self.settings = settings or CodeSettings()
        self.extraction = extraction_mode(extraction)
        limits = Limits(timeout=self.settings.timeout, cpu_seconds=max(1, int(self.settings.timeout)))
        self.sandbox = Sandbox(limits, self.settings.workers, self.settings.allow_unsandboxed)
        self.bad_golds = 0

    @property
    def stats(self) -> Counter:
        return Counter(self.sandbox.stats) + Counter(bad_tests=self.bad_golds)

    def score_texts(
        self, golds: Sequence[str], texts: Sequence[str], problems: Sequence[str | None] | None = None
    ) -> list[float]:
        if len(golds) != len(texts):
            raise ValueError(f"{len(golds)} gold answers but {len(texts)} completions.")
        jobs, where = [], []
        for index, (gold, text) in enumerate(zip(golds, texts)):
            try:
                tests = CodeTests.from_gold(gold)
            except (ValueError, KeyError, TypeError):
                self.bad_golds += 1
                continue
            jobs.append((extract_code(text, self.extraction), tests))
            where.append(index)
        scores = [0.0] * len(golds)
        for index, run in zip(where, self.sandbox.run_many(jobs)):
            scores[index] = run.share if self.settings.partial_credit else float(run.outcome == "passed")
        return scores

    def close(self) -> None:
        self.sandbox.close()


class Verifier:
    """One checker for every gold, by the kind its problem was loaded as (``kinds``): a test suite runs in the
    sandbox, a math answer is verified. The code sandbox starts on the first code gold, so math runs never need
    bubblewrap."""

    def __init__(self, math, code: CodeSettings | None = None) -> None:
        self.math = math
        self.code_settings = code or CodeSettings()
        self._code: CodeVerifier | None = None
        self.extraction = math.extraction
        self.time_limit = math.time_limit

    @property
    def code(self) -> CodeVerifier:
        if self._code is None:
            self._code = CodeVerifier(self.code_settings, self.extraction)
        return self._code

    def start_code(self) -> CodeVerifier:
        """Start the sandbox now (it raises :class:`SandboxUnavailable`, saying how to install bubblewrap, here
        rather than at the first reward)."""
        return self.code

    @property
    def stats(self) -> Counter:
        stats = Counter(self.math.stats)
        if self._code is not None:
            stats.update({f"code/{k}": v for k, v in self._code.stats.items()})
        return stats

    def credits(self, references: Sequence, texts: Sequence[str], problems: Sequence[str]) -> list[bool]:
        """Which ``texts`` it credits against their references' golds (anything with ``answer`` and ``gold_kind``)."""
        golds, kinds = [r.answer for r in references], [r.gold_kind for r in references]
        return [s > 0.5 for s in self.score_texts(golds, texts, problems, kinds=kinds)]

    def credits_rows(self, rows: Sequence) -> list[bool]:
        """Which rollout rows' answers it credits (``feedback_trigger unsolved`` decides on these)."""
        golds, kinds = [r.gold for r in rows], [r.gold_kind for r in rows]
        return [
            s > 0.5 for s in self.score_texts(golds, [r.text for r in rows], [r.problem for r in rows], kinds=kinds)
        ]

    def score_texts(
        self,
        golds: Sequence[str],
        texts: Sequence[str],
        problems: Sequence[str | None] | None = None,
        *,
        kinds: Sequence[GoldKind],
    ) -> list[float]:
        golds, texts, kinds = list(golds), list(texts), list(kinds)
        if len(kinds) != len(golds):
            raise ValueError(f"{len(golds)} gold answers but {len(kinds)} gold kinds.")
        problems = list(problems) if problems is not None else [None] * len(texts)
        code = [i for i, kind in enumerate(kinds) if kind == "code"]
        if not code:
            return self.math.score_texts(golds, texts, problems)
        scores = [0.0] * len(golds)
        for i, value in zip(code, self.code.score_texts([golds[i] for i in code], [texts[i] for i in code])):
            scores[i] = value
        rest = sorted(set(range(len(golds))) - set(code))
        if rest:
            math = self.math.score_texts(
                [golds[i] for i in rest], [texts[i] for i in rest], [problems[i] for i in rest]
            )
            for i, value in zip(rest, math):
                scores[i] = value
        return scores

    def close(self) -> None:
        self.math.close()
        if self._code is not None:
            self._code.close()

    def __enter__(self) -> Verifier:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
