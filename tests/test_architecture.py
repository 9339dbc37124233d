"""The package's shape: one job per module, imports flowing one way."""

from __future__ import annotations

import ast
import contextlib
import io
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "lanpo"

# Lower stages first: a module may import only modules listed before it (function-level imports included).
STAGES = ["numbers", "answers", "prompts", "arith", "presets", "data", "models", "pool", "pool_io", "bm25", "generation", "rewards", "retrieval", "feedback",
          "summarize", "rollout", "objective", "checkpoints", "vllm_cpu", "config", "runlog", "loss", "evaluate",
          "training_eval", "trainer", "sft_data", "sft", "compare", "report", "train", "grid_results", "experiment", "cli", "demo", "__init__"]


def lanpo_imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level == 1 and node.module:
                found.add(node.module.split(".")[0])
            elif node.level == 1:  # `from . import rollout` (a module) or `from . import __version__` (not)
                found.update(a.name for a in node.names if (PACKAGE / f"{a.name}.py").is_file())
            elif node.module and node.module.startswith("lanpo."):
                found.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            found.update(a.name.split(".")[1] for a in node.names if a.name.startswith("lanpo."))
    return found


def test_every_module_has_a_stage_and_imports_only_lower_stages():
    modules = sorted(p.stem for p in PACKAGE.glob("*.py"))
    assert sorted(STAGES) == modules, "add the new module to STAGES at its place in the data flow"
    for name in modules:
        for target in lanpo_imports(PACKAGE / f"{name}.py"):
            if name == "__init__":
                continue  # lazy re-exports only
            assert STAGES.index(target) < STAGES.index(name), f"{name} imports {target}, a later stage"


def test_rollout_and_objective_do_not_depend_on_trl():
    for name in ("rollout", "objective"):
        tree = ast.parse((PACKAGE / f"{name}.py").read_text())
        modules = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)} | \
                  {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        assert not any(m and m.split(".")[0] == "trl" for m in modules), name


def test_config_scorer_names_match_the_implementations():
    from lanpo.config import SCORERS
    from lanpo.retrieval import SCORER_CLASSES

    assert set(SCORERS) == set(SCORER_CLASSES)


def test_choice_fields_show_their_choices_in_help():
    from lanpo.train import parse

    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        parse(["--help"])
    text = out.getvalue()
    assert "{strip,strip-sequence,shaped,unweighted,keep}" in text and "{bm25,embedding,llm}" in text
    assert "{shared,separate,scratch-baseline}" in text


def test_train_help_shows_lanpo_fields_first_with_choices_and_every_lanpo_field():
    from trl import GRPOConfig

    from lanpo.cli import main
    from lanpo.config import LanpoConfig
    from lanpo.train import HELP_GROUPS, train_help

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["train", "--help"]) == 0
    text = out.getvalue()
    assert text == train_help() + "\n"
    head = "\n".join(text.splitlines()[:60])
    assert head.startswith("usage: lanpo train")
    for shown in ("--feedback_ratio", "--reflection_source {auto,step,pool}", "--relevance_scorer {bm25,embedding,llm}",
                  "--context_in_loss {strip,strip-sequence,shaped,unweighted,keep}"):
        assert shown in head, shown
    lanpo_fields = [f for f in LanpoConfig.__dataclass_fields__ if f not in GRPOConfig.__dataclass_fields__]
    grouped = {name for names in HELP_GROUPS.values() for name in names}
    assert set(lanpo_fields) <= grouped, set(lanpo_fields) - grouped
    assert len(text.splitlines()) < 250  # not TRL's 1,400 lines


def test_train_help_all_lists_every_field_under_lanpo_train():
    from lanpo.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["train", "--help-all"]) == 0
    text = out.getvalue()
    assert text.startswith("usage: lanpo train") and "--learning_rate" in text and "--eval_every" in text
    assert "--vllm_importance_sampling_correction" in text and len(text.splitlines()) > 1000
