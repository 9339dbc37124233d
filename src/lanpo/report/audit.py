"""The pool audit (``lanpo pool audit``, a section of ``lanpo report``): are the lessons transferable, and which helped?

The paper's next check 3 asks whether 50 random pool entries after 100 steps hold transferable principles or
problem-specific details. This module measures what a script can and draws the 50 for a person to rate:

- **specificity**: the share of an entry's lessons (principles and pitfalls, what a prompt is shown) that repeat a
  number of its own problem (other than 0 and 1) or a name in it (a capitalised word that does not open a
  sentence). A lesson about "the 17 apples Tom has" serves no other problem;
- **answers stated**: lessons that state an answer at all ("the answer is", ``\\boxed``), hold code, or state
  their own problem's gold in any form (where the golds are known). The scrub at summary time drops these, so
  the count should be 0;
- **repeated and empty lessons**: lessons repeated across problems, told apart by what they name. Two lessons are
  near-duplicates when they hold the same content words (lower case; numbers and :data:`STOPWORDS` dropped; order
  ignored), so "Check the arithmetic carefully" and "carefully check your arithmetic" are one. Repetition alone is
  no fault: a general principle ("line up the digits by place value") repeats across problems as naturally as empty
  praise ("a great example of clarity") does. A lesson that names an operation, a quantity or a check of the
  domain (:func:`names_the_domain`: a word of :data:`DOMAIN_WORDS`, a number, an operator) is substantive;
  one that names none is **empty**, and an entry at least half of whose lessons are empty is **boilerplate**;
- **length and parse state**: words per lesson, lessons per entry, entries with no flow of thought, no principle
  or no pitfall;
- **uses and lift** (:mod:`lanpo.pool.worth`): rows shown the entry, and the mean in-group lift of those whose
  group had scratch rows with its 95% interval (Student t): it helped (interval above 0), hurt (below), unclear,
  or was never credited;
- **concentration**: the share of retrievals taken by the top 10% of entries (10% when retrieval is even).

All numbers are computed from the pool file (and the run's ``retrievals.jsonl`` for pools without worth records);
the golds come from the run's data (:func:`golds_of_run`), never from the pool, which holds none.
"""

from __future__ import annotations

import math
import random
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from lanpo.feedback.labels import ANSWER_STATEMENT, holds_code
from lanpo.pool.store import PoolEntry
from lanpo.pool.worth import Worth
from lanpo.student_t import t975
from lanpo.verify.answers import mentions_answer

SAMPLE = 50  # entries drawn for a person to rate (the paper's check)
SAMPLE_SEED = 0
TOP_SHARE = 0.10  # concentration: the share of retrievals the top 10% of entries take
SPECIFIC = 0.5  # an entry is problem-specific when at least half its lessons are

STOPWORDS = frozenset(
    """a an the and or but if then else of to in on at by for with from as is are was were be been being it its
    this that these those there here we you your i my our they their he she his her them us do does did done not no
    so such than too very can could should would will shall may might must just also each every any all some more
    most other into out up down over under again once only own same both few when where which while who whom what
    why how about after before between through during above below because until against one ones""".split()
)
# Word stems that name an operation, a quantity or a check of lanpo's domains (math and code): a lesson holding a word
# of one (the stem and at most MAX_SUFFIX letters more: "subtracting", not "significant" for "sign"), a number or an
# operator between spaces or digits says something a problem can use, however general; one holding none is empty.
DOMAIN_WORDS = tuple(
    """add addit sum subtract minus differen multipl multiplicat times product divid divis quotient remainder modul
    fraction numerator denominator decimal percent ratio proportion rate average median carry borrow digit place tens
    hundred unit round estimat negative positive sign zero odd parity prime factor factoriz square cube root exponent
    equation variable unknown expression solve substitut simplif simplificat parenthes bracket formula area perimeter
    volume length width height angle triangle circle radius diameter distance speed price cost total count number
    quantit amount value greater equal compar maximum minimum largest smallest inequalit integer half double twice
    third quarter verif verificat check recompute plug calculat comput arithmetic operation loop iterat index list
    array string character element return condition boundary edge empty range slice input output function argument
    parameter recursion sort revers filter append""".split()
)
MAX_SUFFIX = 5
_DOMAIN_WORD = re.compile(rf"^(?:{'|'.join(DOMAIN_WORDS)})[a-z]{{0,{MAX_SUFFIX}}}$")
_OPERATOR = re.compile(r"\d|(?:^|[\s\d])[-+*/×÷=<>^%√](?:$|[\s\d])")
_WORD = re.compile(r"[A-Za-z]+(?:'[a-z]+)?")
_NUMBER = re.compile(r"(?<![\w.])-?\d+(?:[.,]\d+)*")
_SENTENCE_START = re.compile(r"(?:^|[.!?:]\s+|\n\s*)([A-Z][A-Za-z]*)")


@dataclass(frozen=True)
class Gold:
    """A problem's gold answer and what it is (``math`` or ``code``), for the answers-stated check."""

    answer: str
    kind: str = "math"


@dataclass(frozen=True)
class EntryAudit:
    """One entry's figures. ``lift`` is the raw mean of its credited rows' lift (no shrinkage: the audit reports
    what happened), ``low``/``high`` its 95% interval (None below two credited rows)."""

    id: int
    problem_id: str
    step: int
    lessons: int
    words_per_lesson: float
    specific_lessons: int
    answers_stated: int
    repeated_lessons: int  # lessons with a near-duplicate in another problem's entries
    empty_lessons: int  # lessons that name no operation, quantity or check of the domain (names_the_domain)
    repeated_general: int  # repeated lessons that name one: general principles, not boilerplate
    parse: str  # "complete", or what is missing
    uses: int
    credited: int
    lift: float | None
    low: float | None
    high: float | None

    @property
    def specificity(self) -> float:
        return self.specific_lessons / self.lessons if self.lessons else 0.0

    @property
    def lift_reading(self) -> str:
        """``helped`` (interval above 0), ``hurt`` (below), ``unclear``, ``not credited`` or ``never shown``."""
        if not self.uses:
            return "never shown"
        if not self.credited:
            return "not credited"
        if self.low is not None and self.low > 0:
            return "helped"
        if self.high is not None and self.high < 0:
            return "hurt"
        return "unclear"


@dataclass
class Audit:
    """A pool's audit: per-entry figures, the lessons most repeated across problems, retrieval concentration, and
    the entries drawn for a person to rate."""

    pool: str
    entries: list[EntryAudit]
    problems: int
    golds_known: int  # entries whose problem's gold was known to the answers check
    repeated: list[tuple[str, int]]  # (a lesson as first written, how many problems' entries hold it), most first
    retrievals: int  # retrievals counted for concentration (rows shown an entry, or logged prompts)
    retrieval_source: str  # where they were counted
    top_share: float | None  # share of retrievals taken by the top 10% of entries
    retrieved_entries: int  # distinct entries retrieved at least once
    # retrievals per entry, most first, the entries never retrieved as 0s: the curve's shares are of every entry, as
    # top_share's are
    retrieval_counts: list[int] = field(default_factory=list)
    summaries: dict = field(default_factory=dict)  # the run's summary counts over its steps (:func:`summary_counts`)
    sample: list[PoolEntry] = field(default_factory=list)

    def share(self, test) -> float:
        return sum(map(test, self.entries)) / len(self.entries) if self.entries else 0.0

    @property
    def readings(self) -> Counter:
        return Counter(e.lift_reading for e in self.entries)

    def summary(self) -> dict:
        """The audit's headline figures (what ``lanpo report`` shows and the markdown's first table holds)."""
        entries = self.entries
        lessons = sum(e.lessons for e in entries)
        credited = [e for e in entries if e.credited]
        return {
            "entries": len(entries),
            "problems": self.problems,
            "lessons": lessons,
            "mean_specificity": _mean(e.specificity for e in entries),
            "specific_entries": self.share(lambda e: e.specificity >= SPECIFIC),
            "answers_stated": sum(e.answers_stated for e in entries),
            "golds_known": self.golds_known,
            "repeated_lesson_share": sum(e.repeated_lessons for e in entries) / lessons if lessons else 0.0,
            "repeated_general_share": sum(e.repeated_general for e in entries) / lessons if lessons else 0.0,
            "empty_lesson_share": sum(e.empty_lessons for e in entries) / lessons if lessons else 0.0,
            "boilerplate_entries": self.share(lambda e: e.lessons and e.empty_lessons * 2 >= e.lessons),
            "words_per_lesson": _mean(e.words_per_lesson for e in entries if e.lessons),
            "lessons_per_entry": lessons / len(entries) if entries else 0.0,
            "incomplete": dict(Counter(e.parse for e in entries if e.parse != "complete")),
            "shown": sum(1 for e in entries if e.uses),
            "credited": len(credited),
            "mean_lift": _mean(e.lift for e in credited),
            "readings": dict(self.readings),
            "retrievals": self.retrievals,
            "retrieval_source": self.retrieval_source,
            "top10_share": self.top_share,
            "retrieved_entries": self.retrieved_entries,
            "summaries": self.summaries,
        }


def _mean(values: Iterable[float | None]) -> float | None:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


# ---------------------------------------------------------------------------------------------------------------
# One lesson, one entry


def lessons_of(entry: PoolEntry) -> list[str]:
    """What a prompt is shown of an entry: its principles and pitfalls."""
    return [*entry.principles, *entry.pitfalls]


def problem_details(problem: str) -> tuple[set[str], set[str]]:
    """(numbers, names) of a problem's text: numbers other than 0 and 1 (commas dropped), and capitalised words
    that do not open a sentence and are not :data:`STOPWORDS`."""
    numbers = {n.replace(",", "") for n in _NUMBER.findall(problem)} - {"0", "1", "-1"}
    openers = {m.group(1) for m in _SENTENCE_START.finditer(problem)}
    names = {
        w
        for w in _WORD.findall(problem)
        if w[0].isupper() and len(w) > 1 and w not in openers and w.lower() not in STOPWORDS
    }
    return numbers, names


def is_specific(lesson: str, numbers: set[str], names: set[str]) -> bool:
    """Whether a lesson repeats a number or a name of its own problem (:func:`problem_details`)."""
    if numbers and {n.replace(",", "") for n in _NUMBER.findall(lesson)} & numbers:
        return True
    return bool(names and set(_WORD.findall(lesson)) & names)


def names_the_domain(lesson: str) -> bool:
    """Whether a lesson names an operation, a quantity or a check of the domain: a word starting with a stem of
    :data:`DOMAIN_WORDS` ("line up the digits by place value", "check a difference by adding it back", "an empty
    list has no largest element"), a number or an operator. Empty praise and advice about nothing ("a great example
    of clarity", "stay focused and be careful") names none."""
    if _OPERATOR.search(lesson):
        return True
    return any(_DOMAIN_WORD.match(word.lower()) for word in _WORD.findall(lesson))


def states_an_answer(lesson: str, gold: Gold | None) -> bool:
    """Whether a lesson states an answer at all, holds code, or states its own problem's gold in any form."""
    if ANSWER_STATEMENT.search(lesson) or holds_code(lesson, strict=gold is not None and gold.kind == "code"):
        return True
    return gold is not None and gold.kind != "code" and mentions_answer(lesson, gold.answer)


def near_duplicate_key(lesson: str) -> str:
    """A lesson's content words, lower case, sorted and unique: numbers and :data:`STOPWORDS` dropped (a lesson of
    stopwords only keys on all its words)."""
    words = [w.lower() for w in _WORD.findall(lesson)]
    content = sorted({w for w in words if w not in STOPWORDS})
    return " ".join(content or sorted(set(words)))


def parse_state(entry: PoolEntry) -> str:
    missing = [
        name
        for name, value in (
            ("flow of thought", entry.flow_of_thought.strip()),
            ("principles", entry.principles),
            ("pitfalls", entry.pitfalls),
        )
        if not value
    ]
    return "complete" if not missing else "no " + " or ".join(missing)


def lift_interval(worth: Worth) -> tuple[float | None, float | None, float | None]:
    """(mean, low, high) of an entry's credited lift: the raw mean and its 95% Student-t interval; no interval
    below two credited rows, no mean below one."""
    n = worth.credited
    if not n:
        return None, None, None
    mean = worth.lift_sum / n
    if n < 2:
        return mean, None, None
    variance = max(0.0, (worth.lift_sq - n * mean * mean) / (n - 1))
    half = t975(n - 1) * math.sqrt(variance / n)
    return mean, mean - half, mean + half


# ---------------------------------------------------------------------------------------------------------------
# The pool


def top_share(counts: Mapping, entries: int, share: float = TOP_SHARE) -> float | None:
    """The share of all retrievals taken by the ``share`` most retrieved of ``entries`` entries (at least one)."""
    total = sum(counts.values())
    if not total:
        return None
    top = max(1, math.ceil(share * max(entries, len(counts))))
    return sum(sorted(counts.values(), reverse=True)[:top]) / total


SUMMARY_COUNTS = {
    "summaries/requested": "requested",
    "summaries/added": "added to the pool",
    "summaries/parse_failures": "did not parse",
    "lanpo/lessons_dropped": "lessons dropped by the scrub",
}


def summary_counts(metrics: Iterable[dict]) -> dict[str, int]:
    """A run's summaries over its steps (from its ``metrics.jsonl`` records): requested, added, not parsed, and
    lessons the scrub dropped; the parse state of what never reached the pool."""
    totals: Counter = Counter()
    for record in metrics:
        for key, name in SUMMARY_COUNTS.items():
            value = record.get(key)
            if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
                totals[name] += value
    return {name: round(totals[name]) for name in SUMMARY_COUNTS.values() if name in totals}


def concentration_curve(counts: Sequence[int], points: int = 200) -> tuple[list[float], list[float]]:
    """(share of entries, share of retrievals they take), most retrieved first, at most ``points`` points."""
    counts = sorted(counts, reverse=True)
    total = sum(counts)
    if not total:
        return [], []
    x, y, running = [], [], 0
    stride = max(1, len(counts) // points)
    for i, count in enumerate(counts):
        running += count
        if (i + 1) % stride == 0 or i + 1 == len(counts):
            x.append((i + 1) / len(counts))
            y.append(running / total)
    return x, y


def audit_pool(
    entries: Sequence[PoolEntry],
    worth: Mapping[int, Worth],
    golds: Mapping[str, Gold] | None = None,
    retrievals: Iterable[dict] = (),
    name: str = "pool",
    sample: int = SAMPLE,
    seed: int = SAMPLE_SEED,
    metrics: Iterable[dict] = (),
) -> Audit:
    """Audit ``entries`` with their ``worth`` records. ``golds`` (problem id → :class:`Gold`) for the answers check;
    ``retrievals`` (a run's ``retrievals.jsonl`` records) count retrieval concentration when the pool holds no
    worth records with uses (older pools); ``metrics`` (its ``metrics.jsonl`` records) give the summaries' counts."""
    golds = golds or {}
    problems_of_key: dict[str, set[str]] = defaultdict(set)
    first_written: dict[str, str] = {}
    for entry in entries:
        for lesson in lessons_of(entry):
            key = near_duplicate_key(lesson)
            problems_of_key[key].add(entry.problem_id)
            first_written.setdefault(key, lesson)
    audited = []
    for entry in entries:
        lessons = lessons_of(entry)
        numbers, names = problem_details(entry.problem)
        gold = golds.get(entry.problem_id)
        record = worth.get(entry.id, Worth()) if entry.id is not None else Worth()
        lift, low, high = lift_interval(record)
        audited.append(
            EntryAudit(
                id=entry.id if entry.id is not None else -1,
                problem_id=entry.problem_id,
                step=entry.step,
                lessons=len(lessons),
                words_per_lesson=_mean(len(_WORD.findall(x)) for x in lessons) or 0.0,
                specific_lessons=sum(is_specific(x, numbers, names) for x in lessons),
                answers_stated=sum(states_an_answer(x, gold) for x in lessons),
                repeated_lessons=sum(len(problems_of_key[near_duplicate_key(x)]) > 1 for x in lessons),
                empty_lessons=sum(not names_the_domain(x) for x in lessons),
                repeated_general=sum(
                    len(problems_of_key[near_duplicate_key(x)]) > 1 and names_the_domain(x) for x in lessons
                ),
                parse=parse_state(entry),
                uses=record.uses,
                credited=record.credited,
                lift=lift,
                low=low,
                high=high,
            )
        )
    repeated = sorted(
        ((first_written[k], len(p)) for k, p in problems_of_key.items() if len(p) > 1), key=lambda x: (-x[1], x[0])
    )
    counts: Counter = Counter({i: w.uses for i, w in worth.items() if w.uses})
    source = "rows shown each entry (the pool's worth records)"
    if not counts:
        for record in retrievals:
            for hit in record.get("retrieved") or []:
                if isinstance(hit, dict) and isinstance(hit.get("entry_id"), int):
                    counts[hit["entry_id"]] += 1
        source = "prompts that retrieved each entry (retrievals.jsonl)" if counts else "none recorded"
    ever = len(set(counts) | {e.id for e in entries})
    drawn = random.Random(seed).sample(list(entries), min(sample, len(entries)))
    return Audit(
        pool=name,
        entries=audited,
        problems=len({e.problem_id for e in entries}),
        golds_known=sum(e.problem_id in golds for e in entries),
        repeated=repeated,
        retrievals=sum(counts.values()),
        retrieval_source=source,
        top_share=top_share(counts, ever),
        retrieved_entries=len(counts),
        retrieval_counts=sorted(counts.values(), reverse=True) + [0] * (ever - len(counts)),
        summaries=summary_counts(metrics),
        sample=sorted(drawn, key=lambda e: e.id or 0),
    )


# ---------------------------------------------------------------------------------------------------------------
# Writing it out


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{100 * value:.1f}%"


def _num(value: float | None, digits: int = 3) -> str:
    return "—" if value is None else f"{value:+.{digits}f}" if digits == 3 else f"{value:.{digits}f}"


def markdown(audit: Audit, repeated: int = 10) -> str:
    """The audit as markdown: the headline table, the most repeated lessons, the entries that helped and hurt
    most, and the random sample with a line for a person's rating."""
    s = audit.summary()
    readings = s["readings"]
    lines = [
        f"# Pool audit: {audit.pool}",
        "",
        f"{s['entries']} entries of {s['problems']} problems, {s['lessons']} lessons (principles and pitfalls).",
        "",
        "| figure | value |",
        "|---|---|",
        f"| specificity (mean share of an entry's lessons repeating its problem's numbers or names) | "
        f"{_pct(s['mean_specificity'])} |",
        f"| problem-specific entries (at least half their lessons) | {_pct(s['specific_entries'])} |",
        f"| lessons stating an answer, code, or their problem's gold | {s['answers_stated']} "
        f"(golds known for {s['golds_known']} of {s['entries']} entries) |",
        f"| lessons repeated across problems (near-duplicates) | {_pct(s['repeated_lesson_share'])} |",
        f"| of them, general principles (naming an operation, quantity or check) | "
        f"{_pct(s['repeated_general_share'])} |",
        f"| empty lessons (naming no operation, quantity or check) | {_pct(s['empty_lesson_share'])} |",
        f"| boilerplate entries (at least half their lessons empty) | {_pct(s['boilerplate_entries'])} |",
        f"| words per lesson (mean) / lessons per entry | {_num(s['words_per_lesson'], 1)} / "
        f"{s['lessons_per_entry']:.1f} |",
        "| incomplete entries | "
        + (", ".join(f"{k}: {v}" for k, v in sorted(s["incomplete"].items())) or "none")
        + " |",
        "| summaries over the run | "
        + (", ".join(f"{v} {k}" for k, v in s["summaries"].items()) or "not known (no metrics.jsonl)")
        + " |",
        f"| entries shown to a row / credited with lift | {s['shown']} / {s['credited']} |",
        f"| mean lift of credited entries | {_num(s['mean_lift'])} |",
        f"| lift: helped / hurt / unclear (95% interval) | {readings.get('helped', 0)} / {readings.get('hurt', 0)}"
        f" / {readings.get('unclear', 0)} |",
        f"| retrievals counted ({s['retrieval_source']}) | {s['retrievals']} over {s['retrieved_entries']} entries |",
        f"| share of retrievals taken by the top 10% of entries | {_pct(s['top10_share'])} |",
        "",
    ]
    if audit.repeated:
        lines += ["## Lessons repeated across problems", "", "| problems | lesson | names |", "|---|---|---|"]
        lines += [
            f"| {n} | {_cell(text)} | {'the domain' if names_the_domain(text) else 'nothing (empty)'} |"
            for text, n in audit.repeated[:repeated]
        ]
        lines.append("")
    judged = [e for e in audit.entries if e.low is not None]
    if judged:
        lines += [
            "## Lift per entry (credited rows: reward − the group's scratch mean)",
            "",
            "The five entries most surely helpful (highest lower bound) and most surely harmful (lowest upper bound),"
            " of those credited twice or more.",
            "",
            "| entry | problem | uses | credited | mean lift | 95% interval | reading |",
            "|---|---|---|---|---|---|---|",
        ]
        best = sorted(judged, key=lambda e: -e.low)[:5]
        worst = [e for e in sorted(judged, key=lambda e: e.high)[:5] if e not in best]
        for e in best + worst[::-1]:
            lines.append(
                f"| {e.id} | {e.problem_id} | {e.uses} | {e.credited} | {e.lift:+.3f} | "
                f"{e.low:+.3f} … {e.high:+.3f} | {e.lift_reading} |"
            )
        lines.append("")
    if audit.sample:
        by_id = {e.id: e for e in audit.entries}
        lines += [
            f"## {len(audit.sample)} entries drawn at random, for a person to rate",
            "",
            "Rate each: **T** transferable principles, **S** problem-specific details, **B** boilerplate, **W** wrong.",
            "",
        ]
        for entry in audit.sample:
            figures = by_id.get(entry.id)
            note = "" if figures is None else f", specificity {_pct(figures.specificity)}, {figures.lift_reading}"
            lines += [f"### entry {entry.id} · {entry.problem_id} · step {entry.step}{note}", ""]
            lines.append(f"> {_cell(entry.problem[:300])}")
            lines.append("")
            lines += [f"- principle: {_cell(p)}" for p in entry.principles]
            lines += [f"- pitfall: {_cell(p)}" for p in entry.pitfalls]
            lines += ["", "rating: ___", ""]
    return "\n".join(lines).rstrip() + "\n"


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def plot(audit: Audit, out) -> None:
    """Three panels: lift per credited entry sorted, with its interval; specificity of the entries; retrievals by
    entry rank (how concentrated they are)."""
    from lanpo.run.plots import _plt

    plt = _plt()
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    credited = sorted((e for e in audit.entries if e.lift is not None), key=lambda e: e.lift)
    ax = axes[0]
    if credited:
        x = range(len(credited))
        ax.plot(x, [e.lift for e in credited], ".", color="tab:blue", label="mean lift")
        low = [e.low if e.low is not None else e.lift for e in credited]
        high = [e.high if e.high is not None else e.lift for e in credited]
        ax.fill_between(x, low, high, color="tab:blue", alpha=0.2, label="95% interval")
        ax.axhline(0, color="black", lw=0.8)
        ax.legend()
    ax.set_title("lift per credited entry, sorted")
    ax.set_xlabel("entry (by mean lift)")
    ax = axes[1]
    ax.hist([e.specificity for e in audit.entries], bins=10, range=(0, 1), color="tab:orange")
    ax.set_title("specificity (share of lessons naming their problem)")
    ax.set_xlabel("specificity")
    ax.set_ylabel("entries")
    ax = axes[2]
    x, y = concentration_curve(audit.retrieval_counts)
    if x:
        ax.plot(x, y, color="tab:green")
        ax.axvline(TOP_SHARE, color="gray", ls=":")
    ax.set_title("share of retrievals taken by the top entries")
    ax.set_xlabel("share of the entries (most retrieved first)")
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
