"""The package's shape: one job per module, imports flowing one way."""

from __future__ import annotations

import ast
import contextlib
import io
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "lanpo"

# The layers, lowest first: a top-level module (the method) or a role-named subpackage may import only the layers
# listed before it (function-level imports included).
LAYERS = [
    "objective",
    "prompts",
    "verify",
    "data",
    "engine",
    "loss_hooks",
    "pool",
    "feedback",
    "eval",
    "summarize",
    "rollout",
    "config",
    "run",
    "report",
    "trainer",
    "launch",
    "experiments",
    "cli",
    "demo",
]
# Every module in data-flow order, so that inside a layer too imports flow one way.
STAGES = [
    "verify.numerals",
    "verify.answers",
    "prompts",
    "data.arith",
    "data.presets",
    "data.loaders",
    "engine.models",
    "pool.store",
    "pool.io",
    "pool.bm25",
    "engine.generation",
    "verify.rewards",
    "pool.retrieval",
    "feedback",
    "summarize",
    "rollout",
    "objective",
    "run.checkpoints",
    "engine.vllm_cpu",
    "config",
    "run.runlog",
    "loss_hooks",
    "eval.evaluate",
    "eval.during_training",
    "trainer",
    "launch.sft_data",
    "launch.sft",
    "report.compare",
    "report.page",
    "launch.train",
    "experiments.stats",
    "experiments.grid",
    "cli",
    "demo",
]


def modules() -> list[str]:
    return sorted(
        ".".join(p.relative_to(PACKAGE).with_suffix("").parts) for p in PACKAGE.rglob("*.py") if p.name != "__init__.py"
    )


def lanpo_imports(path: Path) -> set[str]:
    """The lanpo modules a file imports (``from lanpo.run import checkpoints`` is ``run.checkpoints``)."""
    known, found = set(modules()), set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            raise AssertionError(f"{path.name}: relative import; lanpo imports absolutely (from lanpo.x import y)")
        names = [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
        if isinstance(node, ast.ImportFrom) and node.module in ("lanpo", *(f"lanpo.{m}" for m in LAYERS)):
            names += [f"{node.module}.{a.name}" for a in node.names]
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        found |= {n.removeprefix("lanpo.") for n in names if n.startswith("lanpo.")} & known
    return found


def layer(module: str) -> str:
    return module.split(".")[0]


def test_every_module_has_a_stage_and_imports_only_lower_stages_and_layers():
    assert sorted(STAGES) == modules(), "add the new module to STAGES at its place in the data flow"
    assert {layer(m) for m in modules()} == set(LAYERS), "add the new subpackage to LAYERS"
    for name in modules():
        for target in lanpo_imports(PACKAGE.joinpath(*name.split(".")).with_suffix(".py")):
            assert STAGES.index(target) < STAGES.index(name), f"{name} imports {target}, a later stage"
            if layer(target) != layer(name):
                assert LAYERS.index(layer(target)) < LAYERS.index(layer(name)), (
                    f"{name} imports {target}: the {layer(target)} layer sits above {layer(name)}"
                )


def test_the_method_sits_at_the_top_of_the_package():
    method = {"prompts", "feedback", "summarize", "rollout", "objective", "config", "loss_hooks", "trainer"}
    assert method <= {p.stem for p in PACKAGE.glob("*.py")}
    assert len(list(PACKAGE.glob("*.py"))) <= 12  # the method, the CLI and the demo; the rest lives in subpackages


def test_rollout_and_objective_do_not_depend_on_trl():
    for name in ("rollout", "objective"):
        tree = ast.parse((PACKAGE / f"{name}.py").read_text())
        modules = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)} | {
            a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names
        }
        assert not any(m and m.split(".")[0] == "trl" for m in modules), name


def test_config_scorer_names_match_the_implementations():
    from lanpo.config import SCORERS
    from lanpo.pool.retrieval import SCORER_CLASSES

    assert set(SCORERS) == set(SCORER_CLASSES)


def test_choice_fields_show_their_choices_in_help():
    from lanpo.launch.train import parse

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
    from lanpo.launch.train import HELP_GROUPS, train_help

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["train", "--help"]) == 0
    text = out.getvalue()
    assert text == train_help() + "\n"
    head = "\n".join(text.splitlines()[:60])
    assert head.startswith("usage: lanpo train")
    for shown in (
        "--feedback_ratio",
        "--reflection_source {auto,step,pool}",
        "--relevance_scorer {bm25,embedding,llm}",
        "--context_in_loss {strip,strip-sequence,shaped,unweighted,keep}",
    ):
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
