"""The docs say what the code does: generated references in step, links that resolve, a README of two screens
whose Python quick start runs as written, and every metric a run logs documented."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]


def _generator():
    spec = importlib.util.spec_from_file_location("docs_generate", DOCS / "generate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _inherited_split(text: str) -> tuple[str, str]:
    head, _, inherited = text.partition("## Inherited from TRL's")
    return head, inherited


def test_the_configuration_reference_is_what_the_code_generates():
    import trl

    generated = _generator().config_reference()
    committed = (DOCS / "reference" / "config.md").read_text()
    ours, theirs = _inherited_split(generated)
    committed_ours, committed_theirs = _inherited_split(committed)
    assert committed_ours == ours, "LanpoConfig or TrainArguments changed: run `make docs`"
    if f"TRL {trl.__version__})" in committed_theirs:  # TRL's own fields: compared under the TRL it was made with
        assert committed_theirs == theirs, "run `make docs`"
    from lanpo.config import LanpoConfig

    for name, field in LanpoConfig.__dataclass_fields__.items():
        if field.init and not name.startswith("_"):
            assert f"| `{name}` |" in committed, name


def test_the_metrics_reference_is_what_the_code_generates():
    assert (DOCS / "reference" / "metrics.md").read_text() == _generator().metrics_reference(), "run `make docs`"


def test_every_documented_metric_is_named_in_the_code():
    from lanpo.run.metrics import METRICS

    source = "\n".join(p.read_text() for p in (ROOT / "src" / "lanpo").rglob("*.py"))
    for name in METRICS:
        stem = name.split("<")[0]
        assert stem and stem in source, name


LANPO_PREFIXES = (
    "lanpo/",
    "reward/",
    "accuracy/",
    "completions/truncated/",
    "retrieval/",
    "summaries/",
    "time/",
    "verifier/",
    "eval/",
    "kl/",
    "score/",
)


@pytest.mark.parametrize(
    "overrides",
    [
        dict(context_in_loss="strip", beta=0.1),
        dict(feedback_trigger="unsolved", feedback_ratio=0.5, reflection_share=1.0, feedback_max_completion_length=10),
        dict(
            feedback_route="score",
            feedback_source="gold",
            eval_every=1,
            eval_benchmarks="builtin:arith?split=test&n=2",
            eval_k=2,
        ),
    ],
    ids=["strip", "unsolved", "score"],
)
def test_every_lanpo_metric_a_run_logs_is_in_the_metrics_reference(tiny_model_dir, tmp_path, overrides):
    from lanpo.run.metrics import metric_pattern
    from test_trainer import make_trainer, stub_summaries

    trainer = make_trainer(tiny_model_dir, tmp_path, max_steps=2, **overrides)
    stub_summaries(trainer)
    trainer.train()
    logged = {key for row in trainer.state.log_history for key in row if key.startswith(LANPO_PREFIXES)}
    assert logged
    assert not {key for key in logged if not metric_pattern(key)}, "add them to lanpo.run.metrics.METRICS"


LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _anchors(page: Path) -> set[str]:
    """GitHub's heading anchors of a Markdown page."""
    slugs = set()
    for line in page.read_text().splitlines():
        if line.startswith("#"):
            text = line.lstrip("#").strip().lower()
            slugs.add(re.sub(r"[^\w\- ]", "", text).replace(" ", "-"))
    return slugs


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_resolves(page):
    for target in LINK.findall(page.read_text()):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        assert resolved.exists(), f"{page.name}: {target}"
        if anchor and resolved.suffix == ".md":
            assert anchor in _anchors(resolved), f"{page.name}: {target} (no such heading)"


def test_the_readme_is_two_screens_and_leads_with_what_a_visitor_needs():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    for needed in ("make demo", "make test", "pip install", "LanpoTrainer", "docs/results.md", "## The manual"):
        assert needed in text, needed
    assert "__DEMO" not in text  # the demo's figures are filled in


@pytest.mark.slow
def test_the_python_quick_start_runs_as_written(tmp_path, zygote):
    """The README's code, as `python -c` runs it, in a process forked from the suite's zygote (its imports done)."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## Quick start: Python", 1)[1]
    code = section.split("```python", 1)[1].split("```", 1)[0]
    done = zygote.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=900,
        env={**__import__("os").environ, "HF_HUB_OFFLINE": "1"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "pool entries" in done.stdout and (tmp_path / "runs" / "quickstart" / "metrics.jsonl").is_file()


def test_the_package_tree_in_the_architecture_page_is_what_the_code_generates():
    generator = _generator()
    assert (DOCS / "architecture.md").read_text() == generator.architecture_page(), "run: make docs"
    assert "(say what it is for" not in generator.package_tree()
    for module in ("runner", "sandbox", "code_tasks", "console"):  # a module on disk is in the tree
        assert module in generator.package_tree()


# -- results a reader takes in at a glance (issue 92) ------------------------------------------------------------

PROSE_PAGES = [ROOT / "README.md", *sorted(p for p in DOCS.glob("*.md") if p.name != "log.md")]
MAX_PARAGRAPH_WORDS = 150
IMAGE = re.compile(r"!\[[^\]]*\]\(([^)\s]+)\)|<img[^>]+src=\"([^\"]+)\"")


def paragraphs(text: str) -> list[str]:
    """The prose paragraphs of a Markdown page: runs of lines between blank lines, headings, tables, fences,
    comments and images; each list item is a paragraph of its own."""
    found, current, fenced = [], [], False
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("```"):
            fenced = not fenced
        special = fenced or stripped.startswith(("```", "|", "#", "<!--", "!["))
        if not stripped or special or (re.match(r"([-*+]|\d+\.)\s", stripped) and current):
            if current:
                found.append(" ".join(current))
            current = []
        if stripped and not special:
            current.append(stripped)
    if current:
        found.append(" ".join(current))
    return found


def test_paragraphs_are_found_as_a_reader_sees_them():
    text = "one two\nthree\n\n| a | b |\n\n- item one\n- item two\n  more\n\n```\ncode words\n```\n# Head\nlast"
    assert paragraphs(text) == ["one two three", "- item one", "- item two more", "last"]


@pytest.mark.parametrize("page", PROSE_PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_paragraph_runs_past_150_words(page):
    long = [p[:80] for p in paragraphs(page.read_text()) if len(p.split()) > MAX_PARAGRAPH_WORDS]
    assert not long, f"{page.name}: split these (the per-cell story belongs in docs/log.md): {long}"


@pytest.mark.parametrize("page", [*PROSE_PAGES, DOCS / "log.md"], ids=lambda p: str(p.relative_to(ROOT)))
def test_every_image_a_page_shows_exists(page):
    for match in IMAGE.finditer(page.read_text()):
        target = match.group(1) or match.group(2)
        if not target.startswith(("http://", "https://")):
            assert (page.parent / target).is_file(), f"{page.name}: {target}"


def test_results_open_with_one_table_of_every_verdict_then_the_figure():
    text = (DOCS / "results.md").read_text()
    head = text[: text.index("\n## ", text.index("## In short") + 1)]
    recorded = [f"{path.name}`" for path in (ROOT / "results").iterdir() if path.is_dir()]
    assert "verdict-worth`" in recorded  # the grids whose cells are kept in git, each a row
    grids = ["verdict`", "verdict-sft`", "code`", *recorded]  # and those that ran before cells were recorded
    assert all(f"[`{grid}" in head for grid in grids), "every grid has a row in the first table"
    assert head.index("| grid") < head.index("verdicts.png") < head.index("What to do at this scale")


def test_no_figure_that_left_results_md_is_lost():
    """Every number results.md held before the move (2026-12-05) is in results.md or the log now."""
    old = subprocess.run(
        ["git", "show", "b5eed5c:docs/results.md"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    if old.returncode != 0:
        pytest.skip("the commit before the move is not in this clone's history")
    figures = set(re.findall(r"[−-]?\d+\.\d+", old.stdout))
    kept = (DOCS / "results.md").read_text() + (DOCS / "log.md").read_text()
    lost = sorted(f for f in figures if f not in kept)
    assert not lost, lost
