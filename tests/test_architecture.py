"""The package's shape: one job per module, imports flowing one way."""

from __future__ import annotations

import ast
import contextlib
import io
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "lanpo"

# One rule keeps the imports flowing one way, with no hand-kept order: the modules' import graph (function-level
# imports included) has no cycle, and neither has the graph of the layers (a top-level module, or a subpackage)
# drawn from it. A new module or subpackage needs no entry here.
LAYER_ORDER_HINT = "a layer that imports another sits above it: move the shared code down, or the caller up"


def modules() -> list[str]:
    return sorted(
        ".".join(p.relative_to(PACKAGE).with_suffix("").parts) for p in PACKAGE.rglob("*.py") if p.name != "__init__.py"
    )


def lanpo_imports(path: Path) -> set[str]:
    """The lanpo modules a file imports (``from lanpo.run import checkpoints`` is ``run.checkpoints``)."""
    known, found = set(modules()), set()
    packages = {layer(m) for m in known}
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            raise AssertionError(f"{path.name}: relative import; lanpo imports absolutely (from lanpo.x import y)")
        names = [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
        if isinstance(node, ast.ImportFrom) and node.module in ("lanpo", *(f"lanpo.{p}" for p in packages)):
            names += [f"{node.module}.{a.name}" for a in node.names]
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        found |= {n.removeprefix("lanpo.") for n in names if n.startswith("lanpo.")} & known
    return found


def layer(module: str) -> str:
    return module.split(".")[0]


def import_graph() -> dict[str, set[str]]:
    return {name: lanpo_imports(PACKAGE.joinpath(*name.split(".")).with_suffix(".py")) for name in modules()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle of ``graph`` as a path that returns to its start, or None."""
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == 1:
                return path[path.index(target) :] + [target]
            if target not in state and (found := visit(target)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def layer_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    layers: dict[str, set[str]] = {}
    for name, targets in graph.items():
        layers.setdefault(layer(name), set()).update(layer(t) for t in targets if layer(t) != layer(name))
    return layers


def test_imports_flow_one_way_between_modules_and_between_layers():
    graph = import_graph()
    assert find_cycle(graph) is None, f"import cycle: {' -> '.join(find_cycle(graph))}"
    layers = layer_graph(graph)
    cycle = find_cycle(layers)
    assert cycle is None, f"layers import each other: {' -> '.join(cycle)} ({LAYER_ORDER_HINT})"


def test_the_rule_finds_cycles_of_any_length():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    assert find_cycle(layer_graph({"x.one": {"y.two"}, "y.two": {"x.three"}, "x.three": set()})) is not None
    assert find_cycle(layer_graph({"x.one": {"x.two"}, "x.two": set()})) is None  # inside a layer: modules decide


def test_the_method_sits_at_the_top_of_the_package():
    method = {"prompts", "plan", "summarize", "rollout", "objective", "config", "loss", "trainer"}
    assert method <= {p.stem for p in PACKAGE.glob("*.py")}
    assert (PACKAGE / "feedback" / "registry.py").is_file()  # the feedback sources: a subpackage with a registry


def test_rollout_objective_and_loss_do_not_depend_on_trl():
    for name in ("rollout", "objective", "loss"):
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
    from lanpo.commands.train import parse

    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        parse(["--help"])
    text = out.getvalue()
    assert "{strip,strip-sequence,shaped,unweighted,keep}" in text and "{bm25,embedding,llm}" in text
    assert "{shared,separate,scratch-baseline}" in text


def test_train_help_shows_lanpo_fields_first_with_choices_and_every_lanpo_field():
    from trl import GRPOConfig

    from lanpo.cli import main
    from lanpo.commands.train import HELP_GROUPS, train_help
    from lanpo.config import LanpoConfig

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["train", "--help"]) == 0
    text = out.getvalue()
    assert text == train_help() + "\n"
    head = "\n".join(text.splitlines()[:60])
    assert head.startswith("usage: lanpo train")
    for shown in (
        "--feedback_ratio",
        "--reflection_source {auto,step,pool,ahead}",
        "--relevance_scorer {bm25,embedding,llm}",
        "--context_in_loss {strip,strip-sequence,shaped,unweighted,keep}",
    ):
        assert shown in head, shown
    lanpo_fields = [f for f in LanpoConfig.__dataclass_fields__ if f not in GRPOConfig.__dataclass_fields__]
    grouped = {name for names in HELP_GROUPS.values() for name in names}
    assert set(lanpo_fields) <= grouped, set(lanpo_fields) - grouped
    assert len(text.splitlines()) < 340  # not TRL's 1,400 lines


def test_train_help_all_lists_every_field_under_lanpo_train():
    from lanpo.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["train", "--help-all"]) == 0
    text = out.getvalue()
    assert text.startswith("usage: lanpo train") and "--learning_rate" in text and "--eval_every" in text
    assert "--vllm_importance_sampling_correction" in text and len(text.splitlines()) > 1000


def choice_fields() -> set[str]:
    """Every ``LanpoConfig`` field whose type is a ``Literal`` (a choice list)."""
    from typing import Literal, get_origin, get_type_hints

    from lanpo.config import LanpoConfig

    hints = get_type_hints(LanpoConfig)
    return {name for name, hint in hints.items() if get_origin(hint) is Literal}


def choice_decodings(tree: ast.AST, fields: set[str]) -> list[str]:
    """Where a module decodes a choice field itself: compares it (``==``, ``in``, ...), indexes with it, matches on
    it, or keeps it in a name of its own (to compare later). Handing the value on as an argument is not decoding."""

    def is_field(node: ast.AST) -> bool:
        return isinstance(node, ast.Attribute) and node.attr in fields

    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and any(is_field(n) for n in ast.walk(node)):
            found.append(f"line {node.lineno}: compares {ast.unparse(node)}")
        elif isinstance(node, ast.Subscript) and is_field(node.slice):
            found.append(f"line {node.lineno}: indexes {ast.unparse(node)}")
        elif isinstance(node, ast.Match) and is_field(node.subject):
            found.append(f"line {node.lineno}: matches on {ast.unparse(node.subject)}")
        elif isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None and is_field(node.value):
            found.append(f"line {node.lineno}: keeps {ast.unparse(node)}")
    return found


def test_every_choice_field_is_decoded_once():
    """Each choice of LanpoConfig (every Literal field) is read as a string only where context_in_loss is: the config
    (its properties: objective, scoring, attempts, grouping, ...) and the step plan. Everything else asks the
    decoded object, or hands the value to the one function that owns its names (make_scorer, find_answer)."""
    fields = choice_fields()
    assert {"context_in_loss", "feedback_source", "reflection_source", "advantage_grouping", "score_teacher"} <= fields
    assert len(fields) >= 15
    offenders = {}
    for path in PACKAGE.rglob("*.py"):
        if path.name in ("plan.py", "config.py"):
            continue
        found = choice_decodings(ast.parse(path.read_text()), fields)
        if found:
            offenders[str(path.relative_to(PACKAGE))] = found
    assert not offenders, offenders


def test_the_decoding_check_finds_each_way_of_decoding():
    """The check above can fail: each way a module could decode a choice itself is found, a hand-on is not."""
    fields = {"reflection_source", "advantage_grouping"}
    for code in (
        'if args.reflection_source == "ahead": pass',
        'x = "step" in (cfg.reflection_source,)',
        "y = TABLE[self.args.advantage_grouping]",
        "match args.reflection_source:\n    case _: pass",
        "mode = kit.args.reflection_source",
    ):
        assert choice_decodings(ast.parse(code), fields), code
    assert not choice_decodings(ast.parse("make(args.reflection_source, args.other == 1)"), fields)


def test_a_golds_kind_is_read_from_its_text_only_where_the_data_does_not_say():
    """A gold's kind (math answer or test suite) is decided when its problem is loaded, then carried (Problem,
    the data set's gold_kind column, Row, Reference, Trial). Its text is read for it in one function, called only
    at the three entrances where data arrives without a kind; no other module looks at a gold's JSON prefix."""
    callers = set()
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text())
        named = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        named |= {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
        if "gold_kind_of" in named:
            callers.add(str(path.relative_to(PACKAGE)))
        if path.name != "sandbox.py":
            assert "CODE_GOLD_KEY" not in named and "code_tests" not in path.read_text(), path
    assert callers == {"data/loaders.py", "verify/rewards.py", "run/checkpoints.py"}, callers


def test_context_in_loss_is_decoded_once():
    """Only plan.py names the objectives and only config.py reads the field: the rest asks the decoded Objective."""
    from lanpo.plan import OBJECTIVES

    for path in PACKAGE.rglob("*.py"):
        if path.name in ("plan.py", "config.py"):
            continue
        tree = ast.parse(path.read_text())
        strings = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
        reads = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
        assert not strings & (set(OBJECTIVES) - {"keep"}), path  # "keep" is also a plain word elsewhere
        assert "context_in_loss" not in reads, path


def test_the_step_plan_is_computed_in_one_place():
    """plan_group is called by the config alone (a step's plan, and the warning at construction)."""
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text())
        calls = {
            n.func.id if isinstance(n.func, ast.Name) else getattr(n.func, "attr", "")
            for n in ast.walk(tree)
            if isinstance(n, ast.Call)
        }
        if path.name != "config.py":
            assert not calls & {"plan_group", "step_plan", "group_plan"} or path.name == "trainer.py", path
    trainer = ast.parse((PACKAGE / "trainer.py").read_text())
    built = [n for n in ast.walk(trainer) if isinstance(n, ast.Call) and getattr(n.func, "attr", "") == "step_plan"]
    assert len(built) == 1  # the trainer builds the plan once, when a generation starts


def test_the_loss_reads_only_its_batch_and_arguments():
    """lanpo.loss holds functions of tensors, the batch and the plan: no class of it reads a trainer's state."""
    tree = ast.parse((PACKAGE / "loss.py").read_text())
    methods = [
        f for c in ast.walk(tree) if isinstance(c, ast.ClassDef) for f in c.body if isinstance(f, ast.FunctionDef)
    ]
    assert not methods
    assert not [n for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id == "self"]


def test_feedback_sources_see_no_label():
    """A source is asked with FeedbackRequests, which carry no gold answer and no reward (a hint level and scale
    are the run's, not the problem's); every planned kind has a source and every source a planned kind; the
    label-free kinds are feedback_source self's and execution (built from the statement's public examples and the
    model's own attempt), and the privileged ones are marked so. (``step`` is the step asking, which wrote the
    attempts it hands over.)"""
    from lanpo.feedback import SOURCES, FeedbackRequest
    from lanpo.plan import KINDS, PRIVILEGED_KINDS, SELF_KINDS

    assert set(FeedbackRequest._fields) == {"problem_id", "problem", "rows", "attempts", "level", "scale", "step"}
    assert set(SOURCES) == set(KINDS)
    assert all(kind == source.kind and source.privileged == KINDS[kind].privileged for kind, source in SOURCES.items())
    assert {k for k, s in SOURCES.items() if s.privileged} == set(PRIVILEGED_KINDS)
    assert {k for k, s in SOURCES.items() if not s.privileged} == {*SELF_KINDS, "execution"}


def test_config_choices_match_the_decoded_objectives():
    from lanpo.config import CONTEXT_IN_LOSS
    from lanpo.plan import OBJECTIVES

    assert set(CONTEXT_IN_LOSS) == set(OBJECTIVES)
    assert all(name == objective.name for name, objective in OBJECTIVES.items())


def test_every_command_is_a_module_of_its_own_and_the_cli_only_dispatches():
    """Each `lanpo` command's flags and body live in one module of lanpo.commands; cli.py holds the table and main."""
    import importlib

    from lanpo.cli import COMMANDS

    for name, (module, _) in COMMANDS.items():
        loaded = importlib.import_module(module)
        assert callable(loaded.add_parser) and callable(loaded.command), name
    tree = ast.parse((PACKAGE / "cli.py").read_text())
    assert [f.name for f in tree.body if isinstance(f, ast.FunctionDef)] == ["main"]


def test_the_command_line_starts_without_torch():
    """`lanpo pool stats` and `lanpo --help` load only the command they run: no torch, no TRL."""
    import subprocess
    import sys

    code = (
        "import sys; import lanpo.cli, lanpo.commands.pool, lanpo.commands.report, lanpo.commands.compare, "
        "lanpo.commands.eval, lanpo.experiments.command; "
        "print(sorted(m for m in ('torch', 'trl', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_each_choice_list_has_one_definition():
    """The feedback sources the config accepts are "self", the kinds the plan knows that are not self's, and
    "sibling" (scoring only); the privileged probe modes of evaluation are the privileged kinds; the decoded tables
    of the plan name exactly the config's choices (issue 69: lists defined twice drift apart)."""
    from typing import get_args

    from lanpo import config, plan
    from lanpo.eval import evaluate

    scoring_only = tuple(s for s in plan.SCORE_SOURCES if s not in plan.KINDS)
    assert scoring_only == ("sibling",)  # a context that only scores: nothing is generated under it
    own = tuple(k for k, kind in plan.KINDS.items() if not kind.joins_self)  # the privileged kinds, and execution
    assert set(own) == {*plan.PRIVILEGED_KINDS, "execution"}
    assert config.FEEDBACK_SOURCES == plan.feedback_sources() == ("self", *own, *scoring_only)
    assert evaluate.PRIVILEGED_MODES is plan.PRIVILEGED_KINDS
    assert not hasattr(plan, "FEEDBACK_SOURCES")
    assert tuple(plan.ATTEMPTS) == get_args(config.ReflectionSource)
    assert tuple(plan.GROUPINGS) == get_args(config.AdvantageGrouping)
    assert all(name == decoded.name for table in (plan.ATTEMPTS, plan.GROUPINGS) for name, decoded in table.items())


@pytest.fixture
def echo_kind():
    """A toy feedback kind, registered for one test and removed after it."""
    from collections import Counter

    from lanpo import plan
    from lanpo.feedback import registry
    from lanpo.feedback.base import Feedback, FeedbackRequest, FeedbackSource
    from lanpo.prompts import user

    class EchoSource(FeedbackSource):
        """Restates the problem before asking for it again: a kind no built-in code names."""

        kind = "echo"

        @classmethod
        def for_run(cls, kit):
            return cls()

        def contexts(self, requests: list[FeedbackRequest], counts: Counter) -> list[list[Feedback]]:
            counts["echo_asked"] += len(requests)
            return [[Feedback(user(f"Restated: {r.problem}\nSolve it."))] * r.rows for r in requests]

    registry.register(EchoSource)
    yield EchoSource
    registry.SOURCES.pop("echo", None)
    plan.KINDS.pop("echo", None)


@pytest.mark.parametrize("trigger", ["always", "unsolved"])
def test_a_kind_registered_in_a_test_trains_with_nothing_else_changed(echo_kind, tiny_model_dir, tmp_path, trigger):
    """Adding a feedback kind is a source and a registry entry: the config accepts it by name, the group plan gives
    it rows, the rollout asks it, its rows train, and its metrics and samples carry its name."""
    import json

    from lanpo.plan import plan_group
    from test_trainer import history, make_trainer

    assert plan_group(4, 0.5, 0.5, "echo").kinds == (("echo", 2),)
    trainer = make_trainer(
        tiny_model_dir, tmp_path, feedback_source="echo", feedback_ratio=0.5, feedback_trigger=trigger, max_steps=2
    )
    assert set(trainer.parts.sources) == {"echo"}
    trainer.policy.rollout.score = lambda rows: (
        [False] * len(rows)
    )  # unsolved: every group fails, so every one is asked
    trainer.train()
    samples = [json.loads(x) for x in (Path(trainer.args.output_dir) / "samples.jsonl").read_text().splitlines()]
    echoed = [s for s in samples if s["kind"] == "echo"]
    assert echoed and all(s["feedback"] for s in echoed)
    assert history(trainer, "accuracy/echo/mean") and max(history(trainer, "lanpo/feedback_share")) == 0.5
    assert all(loss == loss for loss in history(trainer, "loss"))  # finite: its rows reached the loss


def test_a_kind_cannot_take_a_name_the_plan_uses_or_a_source_registered_already(echo_kind):
    from lanpo.feedback import registry
    from lanpo.plan import FeedbackKind, register_kind

    for name in ("scratch", "self", "sibling"):
        with pytest.raises(ValueError, match="named apart"):
            register_kind(FeedbackKind(name, privileged=False))
    with pytest.raises(ValueError, match="split by reflection_share"):
        register_kind(FeedbackKind("third-self-kind", privileged=False, joins_self=True))
    with pytest.raises(ValueError, match="registered already"):
        register_kind(FeedbackKind("gold", privileged=False))
    other = type("OtherEcho", (echo_kind,), {})
    with pytest.raises(ValueError, match="has a source already"):
        registry.register(other)
    registry.register(echo_kind)  # the same source again: nothing changes


TRAINER_NAMES = ("trainer", "host")  # what a helper calls a LanpoTrainer it was handed


def private_reads(tree: ast.AST) -> list[str]:
    """Where a module reads a private attribute of a trainer it holds (``trainer._x``, ``host._x``)."""
    return [
        f"line {node.lineno}: {ast.unparse(node)}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id in TRAINER_NAMES
        and node.attr.startswith("_")
        and not node.attr.startswith("__")
    ]


def test_no_module_but_the_trainer_reads_a_private_attribute_of_the_trainer():
    offenders = {}
    for path in PACKAGE.rglob("*.py"):
        if path.name != "trainer.py" and (found := private_reads(ast.parse(path.read_text()))):
            offenders[str(path.relative_to(PACKAGE))] = found
    assert not offenders, offenders
    assert private_reads(ast.parse("def f(trainer):\n    return trainer._model_io.decode")) == [
        "line 2: trainer._model_io"
    ]  # the check can fail


def test_the_trainer_holds_trls_hooks_and_few_attributes_of_its_own():
    """At most 400 lines and 8 private attributes it assigns itself (TRL's and transformers' own, which it sets as
    TRL does, do not count): the step's state lives in named objects (lanpo.step, lanpo.tap, lanpo.run.meter, ...)."""
    import transformers.trainer
    import trl.trainer.grpo_trainer

    text = (PACKAGE / "trainer.py").read_text()
    assert len(text.splitlines()) <= 400

    def assigned(source: str) -> set[str]:
        return {
            node.attr
            for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Attribute)
            and isinstance(node.ctx, ast.Store)
            and isinstance(node.value, ast.Name)
            and node.value.id == "self"
            and node.attr.startswith("_")
        }

    theirs = set()
    for module in (trl.trainer.grpo_trainer, transformers.trainer):
        theirs |= assigned(Path(module.__file__).read_text())
    own = assigned(text) - theirs
    assert len(own) <= 8, sorted(own)
