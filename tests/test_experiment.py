"""``lanpo experiment``: a grid of arms × seeds, resumable, one table (issue 16)."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from lanpo.cli import main
from lanpo.engine.models import cpu_bf16_native
from lanpo.experiments import grid as experiment
from lanpo.experiments.grid import GridError, load_grid
from lanpo.experiments.stats import _fmt, interpolate, mean_ci, prediction_interval
from lanpo.run.files import PARENT_ENV


@pytest.fixture(autouse=True)
def cells_forked_from_the_zygote(zygote, monkeypatch):
    """The grid's cells (``python -m lanpo.cli train``) run in processes forked from the suite's zygote
    (tests/helpers/zygote.py: the imports done) rather than fresh ones. A cell ends with the process that started
    it (``die_with_parent``): here the zygote, its parent."""

    def run(command, env, **streams):
        return zygote.run(command, env={**env, PARENT_ENV: str(zygote.pid)}, **streams)

    monkeypatch.setattr(experiment, "subprocess", SimpleNamespace(run=run, STDOUT=subprocess.STDOUT))


def tiny_grid(tmp_path: Path, model_dir: Path, **extra) -> Path:
    spec = {
        "name": "tiny",
        "settings": {
            "model_name_or_path": str(model_dir),
            "data": "builtin:arith?n=8",
            "num_generations": 4,
            "per_device_train_batch_size": 4,
            "max_completion_length": 8,
            "max_steps": 2,
            "logging_steps": 1,
            "save_steps": 1,
            "relevance_scorer": "bm25",
            "relevance_threshold": 0.0,
            "disable_tqdm": True,
            "report_to": "none",
            "use_cpu": True,
            "bf16": False,
            "eval_every": 1,
            "eval_benchmarks": "builtin:arith?split=test&n=4",
            "eval_k": 2,
        },
        "seeds": [0, 1],
        "arms": {"grpo": {"feedback_ratio": 0.0}, "lanpo": {}},
        "out": str(tmp_path / "out"),
        **extra,
    }
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


@pytest.mark.slow
def test_a_grid_runs_every_cell_then_a_rerun_does_no_work_and_writes_the_same_table(
    tiny_model_dir, tmp_path, monkeypatch
):
    grid_file = tiny_grid(tmp_path, tiny_model_dir)
    docs = tmp_path / "results-doc.md"
    docs.write_text("# Results\n\nkept text\n")
    monkeypatch.setattr(experiment, "drop_checkpoints", lambda run: None)  # kept, to fake an interruption below
    assert main(["experiment", str(grid_file), "--results-md", str(docs)]) == 0
    out = tmp_path / "out"
    table = (out / "results.md").read_text()
    for arm in ("grpo", "lanpo"):
        for seed in (0, 1):
            cell = json.loads((out / arm / f"seed-{seed}" / "cell.json").read_text())
            assert cell["arm"] == arm and cell["seed"] == seed
            assert cell["machine"]["cpu"] and cell["machine"]["cores"] >= 1  # what ran it, for the record
            assert cell["machine"]["bf16_native"] is cpu_bf16_native()
            assert cell["machine"]["bf16_matmul"] == ("native" if cpu_bf16_native() else "fp32-accumulate")
    metric = "eval/arith/zero-shot/mean@2"
    assert f"### {metric}, by step" in table and f"### {metric}, at equal wall-clock" in table
    rows = [line for line in table.splitlines() if line.startswith("| 2 |")]
    assert rows and rows[0].count("[2]") == 3, rows  # grpo, lanpo and lanpo − grpo, each over 2 seeds
    assert "| grpo | feedback_ratio=0.0 | 2/2 |" in table
    assert (
        "| s/step | feedback share (realized p_t) | summary parse rate | all-fail groups | "
        "train reward, scratch rows | "
        "train reward, feedback rows |"
    ) in table
    assert (out / "results.png").stat().st_size > 0
    assert "kept text" in docs.read_text() and table in docs.read_text()

    def no_runs(*args, **kwargs):
        raise AssertionError("a finished grid ran a cell again")

    monkeypatch.setattr(experiment, "run_cell", no_runs)
    before = docs.read_text()
    assert main(["experiment", str(grid_file), "--results-md", str(docs)]) == 0
    assert (out / "results.md").read_text() == table and docs.read_text() == before
    # the differences against another arm: a table choice, no cell runs
    assert main(["experiment", str(grid_file), "--table-only", "--reference", "lanpo"]) == 0
    other = (out / "results.md").read_text()
    assert "grpo − lanpo" in other and "lanpo − grpo" not in other and "lanpo − grpo" in table
    assert main(["experiment", str(grid_file), "--table-only", "--reference", "nope"]) == 2
    assert main(["experiment", str(grid_file), "--table-only"]) == 0 and (out / "results.md").read_text() == table

    # an interrupted cell (no completion mark, its last checkpoint gone) resumes from its newest checkpoint
    monkeypatch.undo()
    run = out / "lanpo" / "seed-1"
    (run / "cell.json").unlink()
    shutil.rmtree(run / "checkpoint-2")
    assert experiment.cell_state(load_grid(grid_file), "lanpo", 1) == "resume"
    calls = []
    real = experiment.run_cell
    monkeypatch.setattr(experiment, "run_cell", lambda *a: calls.append(a[1:]) or real(*a))
    assert main(["experiment", str(grid_file)]) == 0
    assert calls == [("lanpo", 1, "resume", None, 1)]  # None: its output to the terminal (one job)
    # complete, it drops its checkpoints (1-2 GB each in real runs) and keeps its final model and pool
    assert (run / "cell.json").is_file() and not list(run.glob("checkpoint-*"))
    assert (run / "final" / "config.json").is_file() and (run / "pool.sqlite").is_file()
    assert (out / "grpo" / "seed-0" / "checkpoint-2").is_dir()  # the cells that did not run now: untouched
    steps = [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert 1 in steps and 2 in steps  # step 1's rows kept from before the interruption, step 2 rerun

    # a changed grid is refused for the cells that ran under the old one
    grid_file.write_text(grid_file.read_text().replace("feedback_ratio: 0.0", "feedback_ratio: 0.5"))
    with pytest.raises(GridError, match="grpo/seed-0"):
        experiment.run_grid(load_grid(grid_file))


@pytest.mark.parametrize(
    "change,message",
    [
        ({"arms": {}}, "arms must map"),
        ({"arms": {"a": {"seed": 3}}}, "sets seed or output_dir"),
        ({"seeds": [0, 0]}, "distinct integers"),
        ({"reference": "nope"}, "reference 'nope'"),
        ({"base": "missing.yaml"}, "does not exist"),
        ({"stray": 1}, "unknown keys"),
        ({"extends": "missing.yaml"}, "extends, .*missing.yaml, does not exist"),
        ({"extends": "g.yaml"}, "extends it back"),
        ({"windows": {"metric": "m"}}, "windows must be a list"),
        ({"windows": [{"metric": "m", "steps": [3, 2]}]}, "1 <= first <= last"),
        ({"windows": [{"metric": "m", "steps": [0, 2]}]}, "1 <= first <= last"),
        ({"windows": [{"metric": "m", "steps": [1.5, 2]}]}, "1 <= first <= last"),
        ({"windows": [{"metric": "", "steps": [1, 2]}]}, "must name a logged metric"),
        ({"windows": [{"metric": "m", "steps": [1, 2], "against": "nope"}]}, "against 'nope' is not one of"),
        ({"windows": [{"metric": "m", "steps": [1, 2], "stray": 1}]}, "a window holds metric"),
    ],
)
def test_bad_grids_fail_before_anything_runs(tmp_path, change, message):
    spec = {"name": "g", "arms": {"a": {}}, "seeds": [0], "out": str(tmp_path / "o"), **change}
    path = tmp_path / "g.yaml"
    path.write_text(yaml.safe_dump(spec))
    with pytest.raises(GridError, match=message):
        load_grid(path)


def test_a_grid_extends_another_and_keeps_its_own_name_and_runs(tmp_path):
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "base.yaml").write_text(yaml.safe_dump({"max_steps": 3, "temperature": 0.7}))
    (tmp_path / "grids").mkdir()
    parent = {
        "name": "cpu",
        "base": "../configs/base.yaml",
        "settings": {"max_steps": 30, "eval_k": 4},
        "seeds": [0, 1, 2],
        "reference": "grpo",
        "arms": {"grpo": {"feedback_ratio": 0.0}, "lanpo": {}},
        "out": str(tmp_path / "runs" / "cpu"),
    }
    (tmp_path / "grids" / "cpu.yaml").write_text(yaml.safe_dump(parent))
    (tmp_path / "other").mkdir()
    child = {"extends": "../grids/cpu.yaml", "settings": {"use_cpu": False, "eval_k": 8}}
    (tmp_path / "other" / "gpu.yaml").write_text(yaml.safe_dump(child))
    (tmp_path / "other" / "gpu2.yaml").write_text(yaml.safe_dump({"extends": "gpu.yaml", "seeds": [5]}))

    cpu, gpu = load_grid(tmp_path / "grids" / "cpu.yaml"), load_grid(tmp_path / "other" / "gpu.yaml")
    assert gpu.arms == cpu.arms and gpu.seeds == cpu.seeds and gpu.reference == cpu.reference
    assert gpu.base == cpu.base == {"max_steps": 3, "temperature": 0.7}  # the base is found from the file naming it
    assert gpu.settings == {"max_steps": 30, "eval_k": 8, "use_cpu": False}  # its settings over the parent's
    assert gpu.name == "gpu" and gpu.out == Path("runs/experiments/gpu")  # never the parent's run directories
    deeper = load_grid(tmp_path / "other" / "gpu2.yaml")
    assert deeper.seeds == [5] and deeper.settings == gpu.settings and deeper.arms == cpu.arms


def test_an_arm_with_a_bad_field_is_named_before_any_cell_runs(tiny_model_dir, tmp_path, monkeypatch):
    grid_file = tiny_grid(tmp_path, tiny_model_dir, arms={"ok": {}, "bad": {"feedback_ratio": 3.0}})
    monkeypatch.setattr(experiment, "run_cell", lambda *a: pytest.fail("ran a cell before validating every arm"))
    before = sorted(p for p in tmp_path.rglob("*"))
    with pytest.raises(GridError, match="arm 'bad'.*feedback_ratio"):
        experiment.run_grid(load_grid(grid_file))
    assert sorted(p for p in tmp_path.rglob("*")) == before  # no cell's YAML left behind


def test_seeds_outside_the_grid_are_refused(tiny_model_dir, tmp_path, monkeypatch):
    grid = load_grid(tiny_grid(tmp_path, tiny_model_dir))
    monkeypatch.setattr(experiment, "run_cell", lambda *a: pytest.fail("ran a cell the table would never show"))
    with pytest.raises(GridError, match="--seeds 7: not seeds of tiny"):
        experiment.run_grid(grid, seeds=[0, 7])


def test_mean_ci_matches_student_t():
    mean, half, se = mean_ci([0.1, 0.2, 0.3])
    assert mean == pytest.approx(0.2) and se == pytest.approx(0.1 / math.sqrt(3))
    assert half == pytest.approx(4.303 * se)
    assert mean_ci([0.5]) == (0.5, None, None)


def test_prediction_interval_is_for_one_more_draw():
    low, high = prediction_interval([0.1, 0.2, 0.3])
    assert (low + high) / 2 == pytest.approx(0.2)
    assert (high - low) / 2 == pytest.approx(4.303 * 0.1 * math.sqrt(1 + 1 / 3))
    assert prediction_interval([0.5]) is None


def test_prediction_interval_covers_a_new_seed_95_percent_of_the_time():
    """Three seeds, then a fourth from the same distribution: the prediction interval holds it about 95% of the
    time; the CI of the mean (the range for the mean, not for one run) far less often."""
    import random

    rng = random.Random(0)
    trials, in_pi, in_ci = 4000, 0, 0
    for _ in range(trials):
        seeds = [rng.gauss(0.4, 0.05) for _ in range(3)]
        new = rng.gauss(0.4, 0.05)
        low, high = prediction_interval(seeds)
        mean, half, _ = mean_ci(seeds)
        in_pi += low <= new <= high
        in_ci += abs(new - mean) <= half
    assert 0.93 <= in_pi / trials <= 0.97
    assert in_ci / trials < 0.85


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(-1, 1), min_size=2, max_size=12))
def test_prediction_interval_is_the_ci_widened_by_root_n_plus_one(values):
    mean, half, _ = mean_ci(values)
    low, high = prediction_interval(values)
    assert low <= mean <= high
    assert (high - low) / 2 == pytest.approx(half * math.sqrt(len(values) + 1), abs=1e-9)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(-1, 1), min_size=2, max_size=12), st.floats(-1, 1))
def test_ci_contains_the_mean_and_shifts_with_the_data(values, shift):
    mean, half, se = mean_ci(values)
    moved = mean_ci([v + shift for v in values])
    assert half >= 0 and se >= 0
    assert moved[0] == pytest.approx(mean + shift, abs=1e-9) and moved[1] == pytest.approx(half, abs=1e-9)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 1000), st.floats(-1, 1)), min_size=1, max_size=8), st.floats(0, 1000))
def test_interpolation_stays_between_neighbours_and_never_extrapolates(points, x):
    points = sorted({round(p[0], 3): p[1] for p in points}.items())
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    y = interpolate(xs, ys, x)
    if x > xs[-1] + 1e-9 or x < xs[0] - 1e-9:  # within 1e-9 of an end counts as the end (float noise)
        assert y is None
    else:
        assert y is not None and min(ys) - 1e-9 <= y <= max(ys) + 1e-9
    for px, py in points:  # through every point
        assert interpolate(xs, ys, px) == pytest.approx(py, abs=1e-9)


def test_shipped_grids_load_and_their_cells_parse(tmp_path):
    from lanpo.commands.train import parse

    for path in sorted(Path("configs/experiments").glob("*.yaml")):
        grid = load_grid(path)
        # a pilot picks arms on one seed of its own; a comparison has 3 seeds or more, the verdict 5 or more
        fewest = 1 if path.stem.endswith("-pilot") else 5 if path.stem.startswith("verdict") else 3
        assert grid.reference in grid.arms and len(grid.seeds) >= fewest, path
        if path.stem.endswith("-pilot"):  # its pick must not be made on the seeds it is then judged on
            judged = load_grid(path.with_name(path.stem.removesuffix("-pilot") + ".yaml"))
            assert not set(grid.seeds) & set(judged.seeds), path
        for arm in grid.arms:
            spec = tmp_path / f"{path.stem}-{arm}.yaml"
            spec.write_text(yaml.safe_dump(grid.config(arm, grid.seeds[0])))
            _, _, config = parse(["--config", str(spec)])  # no model loads: only the config is checked
            if arm == "grpo":  # the baseline is plain GRPO: no feedback, and no summaries (p_t 0 runs them apart)
                assert config.feedback_ratio == 0 and config.summaries_per_group == 0, path


@pytest.mark.parametrize("name", ["embedded", "embedded-sft"])
def test_the_gpu_grid_is_the_embedded_grid_on_another_device(name):
    """NAME-gpu.yaml repeats NAME.yaml's settings and arms: they must not drift apart."""
    cpu = load_grid(f"configs/experiments/{name}.yaml")
    gpu = load_grid(f"configs/experiments/{name}-gpu.yaml")
    device = {"use_cpu", "bf16"}
    assert gpu.arms == cpu.arms and gpu.seeds == cpu.seeds and gpu.reference == cpu.reference
    assert gpu.base == cpu.base
    assert {k: v for k, v in gpu.settings.items() if k not in device} == cpu.settings
    assert gpu.settings["use_cpu"] is False and gpu.out != cpu.out


@pytest.mark.slow
def test_jobs_run_cells_at_once_each_with_its_log(tiny_model_dir, tmp_path, monkeypatch):
    grid_file = tiny_grid(tmp_path, tiny_model_dir)
    grid = load_grid(grid_file)
    running, peak = set(), []
    real = experiment.run_cell

    def tracked(grid, arm, seed, state, log=None, jobs=1):
        running.add((arm, seed))
        peak.append(len(running))
        try:
            return real(grid, arm, seed, state, log, jobs)
        finally:
            running.discard((arm, seed))

    monkeypatch.setattr(experiment, "run_cell", tracked)
    assert main(["experiment", str(grid_file), "--jobs", "2", "--seeds", "0"]) == 0
    assert max(peak) == 2  # both cells (grpo and lanpo, seed 0) ran at once
    for arm in ("grpo", "lanpo"):
        assert (grid.run_dir(arm, 0) / "cell.json").is_file()
        assert "train" in grid.run_dir(arm, 0).with_suffix(".log").read_text().lower()
    assert not grid.run_dir("grpo", 1).exists()


def test_cells_run_at_once_share_the_cores_unless_the_user_chose():
    assert experiment.cell_env(2, {"PATH": "/bin"}, cpus=2) == {"PATH": "/bin", "OMP_NUM_THREADS": "1"}
    assert experiment.cell_env(4, {}, cpus=16)["OMP_NUM_THREADS"] == "4"
    assert experiment.cell_env(8, {}, cpus=2)["OMP_NUM_THREADS"] == "1"  # never 0
    assert experiment.cell_env(2, {"OMP_NUM_THREADS": "3"}, cpus=2)["OMP_NUM_THREADS"] == "3"
    assert "OMP_NUM_THREADS" not in experiment.cell_env(1, {}, cpus=2)  # one cell: torch's own default


def test_jobs_below_one_are_refused(tmp_path, capsys):
    grid_file = tiny_grid(tmp_path, tmp_path / "no-model-needed")
    assert main(["experiment", str(grid_file), "--jobs", "0"]) != 0
    assert "--jobs must be 1 or more" in capsys.readouterr().err


def test_a_cells_training_diagnostics_are_means_over_its_steps(tmp_path):
    from lanpo.experiments.stats import cell_results

    rows = [
        {"step": 0, "eval/arith/zero-shot/mean@4": 0.25},
        {
            "step": 1,
            "step_time": 10.0,
            "reward/scratch/mean": 0.5,
            "reward/feedback/mean": 0.0,
            "completions/clipped_ratio": 0.25,
            "lanpo/feedback_share": 0.75,
            "lanpo/all_fail_share": 0.5,
        },
        {
            "step": 2,
            "step_time": 20.0,
            "reward/scratch/mean": 1.0,
            "completions/clipped_ratio": 0.75,
            "summaries/parse_rate": 0.5,
            "lanpo/feedback_share": 0.25,
            "lanpo/all_fail_share": 0.0,
        },
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cell = cell_results(tmp_path)
    assert cell["training"] == {
        "feedback share (realized p_t)": 0.5,
        "summary parse rate": 0.5,
        "all-fail groups": 0.25,
        "train reward, scratch rows": 0.75,
        "train reward, feedback rows": 0.0,
        "truncated": 0.5,
    }
    assert cell["step_time"] == 15.0 and cell["seconds"] == {0: 0.0, 1: 10.0, 2: 30.0}
    assert cell["evals"] == {"eval/arith/zero-shot/mean@4": {0: 0.25}}


WALL_METRIC = "eval/arith/zero-shot/mean@4"


def _cell(evals, seconds):
    from lanpo.experiments.stats import TRAINING

    return {"evals": {WALL_METRIC: evals}, "seconds": seconds, "step_time": 1.0, "training": dict.fromkeys(TRAINING)}


def _section_rows(table: str, title: str, first_column: str) -> list[list[str]]:
    """The cells of the data rows of the table under the heading that contains ``title``."""
    lines = table.split(title)[1].split("###")[0].splitlines()
    return [
        [c.strip() for c in line.strip("|").split("|")]
        for line in lines
        if line.startswith("| ") and not line.startswith(f"| {first_column}")
    ]


def _wall_clock_rows(table: str) -> list[list[str]]:
    return _section_rows(table, "at equal wall-clock", "minutes")


@settings(max_examples=50, deadline=None)
@given(st.lists(st.lists(st.floats(1.0, 500.0), min_size=3, max_size=3), min_size=1, max_size=4))
def test_every_reference_seed_counts_at_every_wall_clock_mark(step_seconds):
    """Whatever the seeds' speeds, each equal-wall-clock row has a value from every reference seed."""
    from lanpo.experiments.grid import Grid
    from lanpo.experiments.stats import results_table

    def cell(durations):
        clock = [0.0]
        for d in durations:
            clock.append(clock[-1] + d)
        return _cell({10 * i: 0.1 * i for i in range(4)}, {10 * i: t for i, t in enumerate(clock)})

    seeds = list(range(len(step_seconds)))
    grid = Grid(name="g", arms={"grpo": {}}, seeds=seeds, out=Path("unused"), reference="grpo")
    table = results_table(grid, {"grpo": {s: cell(d) for s, d in zip(seeds, step_seconds)}})
    rows = _wall_clock_rows(table)
    assert len(rows) == 3  # steps 10, 20, 30
    assert all(row[1].endswith(f"[{len(seeds)}]") for row in rows), rows


def test_table_gives_where_one_more_seed_should_land(tmp_path):
    from lanpo.experiments.grid import Grid
    from lanpo.experiments.stats import results_table

    grid = Grid(name="g", arms={"grpo": {}, "lanpo": {}}, seeds=[0, 1, 2], out=tmp_path, reference="grpo")
    finals = {0: 0.4, 1: 0.5, 2: 0.6}
    results = {
        "grpo": {s: _cell({0: 0.1, 10: v}, {0: 0.0, 10: 60.0}) for s, v in finals.items()},
        "lanpo": {0: _cell({0: 0.1, 10: 0.3}, {0: 0.0, 10: 90.0})},
    }  # one seed: no interval
    table = results_table(grid, results)
    title = "where one more seed's run should land"
    section = table.split(title)[1].split("###")[0]
    rows = {r[0]: r[1:] for r in _section_rows(table, title, "step")}
    low, high = prediction_interval(list(finals.values()))
    assert rows["10"] == [f"{low:.3f} – {high:.3f} [3]"]
    assert "| step | grpo |" in section.splitlines()  # lanpo, with one seed, has no column
    wide = results_table(grid, {"grpo": {s: _cell({10: v}, {0: 0.0, 10: 60.0}) for s, v in {0: 0.0, 1: 1.0}.items()}})
    assert "| 10 | 0.000 – 1.000 [2] |" in wide  # mean@k is a share: the interval stays inside [0, 1]


def test_equal_wall_clock_marks_are_reached_by_every_reference_seed(tmp_path):
    from lanpo.experiments.grid import Grid
    from lanpo.experiments.stats import results_table

    grid = Grid(name="g", arms={"grpo": {}, "lanpo": {}}, seeds=[0, 1], out=tmp_path, reference="grpo")
    results = {
        "grpo": {
            0: _cell({0: 0.1, 10: 0.3}, {0: 0.0, 10: 600.0}),  # the faster seed: 10 min
            1: _cell({0: 0.1, 10: 0.5}, {0: 0.0, 10: 900.0}),
        },
        "lanpo": {0: _cell({0: 0.1, 10: 0.2}, {0: 0.0, 10: 1200.0}), 1: _cell({0: 0.1, 10: 0.4}, {0: 0.0, 10: 1200.0})},
    }
    table = results_table(grid, results)
    row = next(r for r in _wall_clock_rows(table) if r[0] == "10.0")
    # at 10 min: grpo seed 0 at its step 10 (0.3), seed 1 two thirds of the way (0.1 + 0.4 * 600 / 900)
    grpo, lanpo, diff = row[1:4]
    assert grpo.startswith(f"{(0.3 + 0.1 + 0.4 * 600 / 900) / 2:.3f}") and grpo.endswith("[2]")
    assert lanpo.startswith(f"{(0.1 + 0.1 * 0.5 + 0.1 + 0.3 * 0.5) / 2:.3f}") and lanpo.endswith("[2]")
    assert diff.endswith("[2]")


def test_unfinished_cells_enter_the_table_only_when_asked_and_marked(tmp_path):
    grid_file = tiny_grid(tmp_path, tmp_path / "no-model")
    out = tmp_path / "out"

    def cell(arm, seed, evals, complete):
        run = out / arm / f"seed-{seed}"
        run.mkdir(parents=True)
        _write_evals(run, evals)
        if complete:
            (run / "cell.json").write_text("{}")

    cell("grpo", 0, {0: 0.2, 1: 0.3, 2: 0.4}, True)
    cell("grpo", 1, {0: 0.2, 1: 0.4}, False)  # stopped after step 1
    cell("lanpo", 0, {0: 0.2, 1: 0.35}, False)
    cell("lanpo", 1, {0: 0.2, 1: 0.25}, False)  # no lanpo seed reached step 2
    assert main(["experiment", str(grid_file), "--table-only"]) == 0
    finished = (out / "results.md").read_text()
    assert "| grpo | feedback_ratio=0.0 | 1/2 |" in finished and "| lanpo | (base) | 0/2 |" in finished
    assert "unfinished" not in finished
    assert main(["experiment", str(grid_file), "--table-only", "--unfinished"]) == 0
    table = (out / "results.md").read_text()
    assert "| grpo | feedback_ratio=0.0 | 2/2 (1 unfinished) |" in table
    assert "| lanpo | (base) | 2/2 (2 unfinished) |" in table
    rows = {r[0]: r[1:] for r in _section_rows(table, "mean@2, by step", "step")}
    assert rows["1"] == [
        f"{_fmt_ci([0.3, 0.4])} [2]",
        f"{_fmt_ci([0.35, 0.25])} [2]",
        f"{_fmt_ci([0.05, -0.15], '+')} [2]",
    ]  # lanpo − grpo, paired by seed
    assert rows["2"] == ["0.400 [1]", "—", "—"]
    spread = {r[0]: r[1:] for r in _section_rows(table, "should land", "step")}
    assert spread["2"] == ["—", "—"] and spread["1"][1].endswith("[2]")  # no interval from fewer than 2 seeds


def _fmt_ci(values, sign=""):
    return _fmt(*mean_ci(values), signed=sign == "+")


def _verdict_rows(text: str) -> dict[str, list[str]]:
    return {r[0]: r[1:] for r in _section_rows(text, "each arm against", "arm")}


def _paired(results, arm, step, ref="grpo"):
    return [
        results[arm][s]["evals"][WALL_METRIC][step] - results[ref][s]["evals"][WALL_METRIC][step] for s in (0, 1, 2)
    ]


def test_the_verdict_gives_each_arm_against_the_reference_at_the_last_step_and_equal_wall_clock(tmp_path):
    from lanpo.experiments.grid import Grid
    from lanpo.experiments.stats import verdict_table

    arms = {"grpo": {"feedback_ratio": 0.0}, "ahead": {}, "behind": {"x": 1}, "noisy": {"x": 2}, "slow": {"x": 3}}
    grid = Grid(name="g", arms=arms, seeds=[0, 1, 2], out=tmp_path, reference="grpo")
    grpo = {0: 0.20, 1: 0.30, 2: 0.25}
    shift = {"ahead": [0.10, 0.11, 0.12], "behind": [-0.10, -0.12, -0.11], "noisy": [0.2, -0.2, 0.05]}
    fast = {0: 0.0, 4: 60.0, 8: 120.0}
    results = {"grpo": {s: _cell({0: 0.1, 4: 0.15, 8: v}, fast) for s, v in grpo.items()}}
    for arm, d in shift.items():
        results[arm] = {s: _cell({0: 0.1, 4: 0.15, 8: grpo[s] + d[s]}, fast) for s in grpo}
    # as good at step 8 as "ahead", but twice as slow: at equal wall-clock (120 s) it is at its step 4
    results["slow"] = {
        s: _cell({0: 0.1, 4: grpo[s] - 0.1, 8: grpo[s] + 0.1 + 0.01 * s}, {0: 0.0, 4: 120.0, 8: 240.0}) for s in grpo
    }
    text = verdict_table(grid, results)
    assert "`grpo` at step 8: 0.250 ± " in text and "at 2.0 min of training" in text
    rows = _verdict_rows(text)
    assert rows["grpo"][:5] == ["feedback_ratio=0.0", "reference", "reference", "3", "—"]
    assert rows["ahead"][4] == "ahead at both" and rows["behind"][4] == "behind at both"
    assert rows["noisy"][4] == "inside the noise at both"
    assert rows["slow"][4] == "ahead at equal steps, behind at equal wall-clock"
    for arm in ("ahead", "behind", "noisy", "slow"):
        mean, half, _ = mean_ci(_paired(results, arm, 8))
        assert rows[arm][1] == f"{mean:+.3f} ± {half:.3f}" and rows[arm][3] == "3"
        low, high = prediction_interval([c["evals"][WALL_METRIC][8] for c in results[arm].values()])
        assert rows[arm][5] == f"{max(low, 0.0):.3f} – {min(high, 1.0):.3f}"
    assert rows["slow"][2] == "-0.100 ± 0.000"  # its step 4 (grpo − 0.1) against grpo's step 8, every seed


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.floats(0.0, 1.0), min_size=2, max_size=6),
    st.lists(st.floats(-0.5, 0.5).map(lambda x: round(x, 3)), min_size=6, max_size=6),
    st.lists(st.floats(1.0, 500.0), min_size=6, max_size=6),
)
def test_verdict_readings_follow_the_paired_interval_and_equal_speeds_give_equal_columns(grpo, shift, seconds):
    """Whatever the values: an arm as fast as the reference reads the same at equal steps and equal wall-clock
    (the same paired numbers), and "ahead"/"behind" only when the 95% CI excludes 0 on that side."""
    from lanpo.experiments.grid import Grid
    from lanpo.experiments.stats import verdict_table

    seeds = list(range(len(grpo)))
    grid = Grid(name="g", arms={"grpo": {}, "variant": {}}, seeds=seeds, out=Path("unused"), reference="grpo")
    clock = {s: {0: 0.0, 10: seconds[s]} for s in seeds}  # every seed its own speed, the same in both arms
    results = {
        "grpo": {s: _cell({0: 0.1, 10: grpo[s]}, clock[s]) for s in seeds},
        "variant": {s: _cell({0: 0.1, 10: grpo[s] + shift[s]}, clock[s]) for s in seeds},
    }
    row = _verdict_rows(verdict_table(grid, results))["variant"]
    mean, half, _ = mean_ci([shift[s] for s in seeds])
    at_steps = row[4].removesuffix(" at both").split(" at equal steps")[0]
    assert at_steps == ("ahead" if mean - half > 0 else "behind" if mean + half < 0 else "inside the noise")

    def numbers(cell: str) -> list[float]:
        return [float(x) for x in cell.split(" ± ")]

    assert numbers(row[1]) == pytest.approx([mean, half], abs=1.5e-3) and row[3] == str(len(seeds))
    # at equal wall-clock (the fastest reference seed's time) slower seeds are interpolated: both columns are
    # the same numbers when every seed is as fast
    if len(set(seconds[: len(seeds)])) == 1:
        assert numbers(row[2]) == pytest.approx(numbers(row[1]), abs=1.5e-3) and row[4].endswith(" at both")


def test_verdict_md_fills_its_markers_where_the_user_put_them(tmp_path):
    grid_file = tiny_grid(tmp_path, tmp_path / "no-model")
    out = tmp_path / "out"
    for arm, seed, final in (("grpo", 0, 0.3), ("grpo", 1, 0.4), ("lanpo", 0, 0.35), ("lanpo", 1, 0.5)):
        run = out / arm / f"seed-{seed}"
        run.mkdir(parents=True)
        rows = [{"step": 0, "eval/arith/zero-shot/mean@2": 0.2}, {"step": 2, "eval/arith/zero-shot/mean@2": final}]
        rows[1]["step_time"] = 5.0
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (run / "cell.json").write_text("{}")
    doc = tmp_path / "results.md"
    doc.write_text("# Results\n\n<!-- lanpo-verdict:tiny -->\nold\n<!-- /lanpo-verdict:tiny -->\n\nthe diary below\n")
    assert main(["experiment", str(grid_file), "--table-only", "--verdict-md", str(doc)]) == 0
    text = doc.read_text()
    assert text.startswith("# Results\n\n<!-- lanpo-verdict:tiny -->\n### Grid `tiny`") and "old" not in text
    assert text.endswith("<!-- /lanpo-verdict:tiny -->\n\nthe diary below\n")
    rows = _verdict_rows(text)
    assert rows["lanpo"][1] == f"{_fmt_ci([0.05, 0.1], '+').split(' (')[0]}" and rows["lanpo"][3] == "2"
    assert (out / "verdict.md").read_text() in text


# -- round four (issue 50): the verdict writer and the runner -------------------------------------------------


def _logged_cell(run: Path, rows: list[dict]) -> None:
    from lanpo.experiments.stats import COMPLETE

    run.mkdir(parents=True, exist_ok=True)
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / COMPLETE).write_text(json.dumps({"config": "x"}))


def test_a_grid_whose_step_times_were_logged_every_few_steps_gets_its_tables(tmp_path):
    """TRL logs step_time at its logging steps as the mean over the steps since the last: 8 steps logged once
    (logging_steps 10) are 8 steps of that time, and an eval step between logged ones is interpolated."""
    from lanpo.experiments.grid import Grid
    from lanpo.experiments.stats import cell_results, collect, results_table, verdict_table

    grid = Grid(name="g", arms={"grpo": {}, "lanpo": {}}, seeds=[0, 1], out=tmp_path, reference="grpo")
    for arm in grid.arms:
        for seed in grid.seeds:
            rows = [{"step": 0, WALL_METRIC: 0.2}, {"step": 4, WALL_METRIC: 0.25}]
            rows += [{"step": 8, WALL_METRIC: 0.3 + 0.01 * seed, "step_time": 50.0}]
            _logged_cell(grid.run_dir(arm, seed), rows)
    cell = cell_results(grid.run_dir("grpo", 0))
    assert cell["seconds"] == {0: 0.0, 4: 200.0, 8: 400.0} and cell["step_time"] == 50.0
    results = collect(grid)
    verdict = verdict_table(grid, results)
    assert "6.7 min of training" in verdict and "| lanpo | (base) | +0.000 ± 0.000 | +0.000 ± 0.000 |" in verdict
    assert "| grpo |" in results_table(grid, results)  # no division by zero on the way


@pytest.mark.parametrize("bad", [float("nan"), "abc", None, "Infinity"])
def test_evaluation_values_that_are_not_numbers_are_left_out_naming_the_file(tmp_path, capsys, bad):
    from lanpo.experiments.stats import cell_results

    run = tmp_path / "cell"
    rows = [{"step": 0, WALL_METRIC: 0.2}, {"step": 4, WALL_METRIC: bad, "step_time": 1.0}]
    rows += [{"step": "four", WALL_METRIC: 0.9}, {"step": 8, WALL_METRIC: 0.3, "step_time": 1.0}]
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cell = cell_results(run)
    assert cell["evals"] == {WALL_METRIC: {0: 0.2, 8: 0.3}}
    assert str(run / "metrics.jsonl") in capsys.readouterr().err


def test_a_garbage_cell_record_is_refused_naming_it(tiny_model_dir, tmp_path):
    grid = load_grid(tiny_grid(tmp_path, tiny_model_dir))
    record = grid.run_dir("grpo", 0) / "cell.json"
    record.parent.mkdir(parents=True)
    for text in ("not json", "[1, 2]", '{"config": 3}', ""):
        record.write_text(text)
        with pytest.raises(GridError, match="cell.json is not a cell record"):
            experiment.cell_state(grid, "grpo", 0)


def test_a_cell_another_runner_holds_is_left_to_it_and_said(tiny_model_dir, tmp_path, monkeypatch, capsys):
    grid = load_grid(tiny_grid(tmp_path, tiny_model_dir, seeds=[0]))
    ran = []
    monkeypatch.setattr(experiment, "run_cell", lambda g, arm, seed, *a: ran.append((arm, seed)) or True)
    with experiment.cell_lock(grid, "grpo", 0) as held:  # the other runner
        assert held
        with experiment.cell_lock(grid, "grpo", 0) as again:
            assert not again  # one holder at a time, even within one process
        experiment.run_grid(grid)
    assert ran == [("lanpo", 0)]
    out = capsys.readouterr()
    assert "grpo seed 0: skipped, another runner is training it" in out.out and "grpo/seed-0" in out.err


MARKER_LINES = st.lists(st.sampled_from(["start", "end", "other-start", "text"]), min_size=0, max_size=6)


@settings(max_examples=200, deadline=None)
@given(MARKER_LINES)
def test_the_verdict_writer_never_loses_the_users_text(tmp_path_factory, layout):
    """Whatever markers a file holds, the writer either puts the block between one well-ordered pair, appends it
    when there is none, or refuses naming the lines and leaves the file as it was; every paragraph of the
    user's outside the block survives."""
    from lanpo.experiments.stats import section_markers, write_section

    path = tmp_path_factory.mktemp("md") / "results.md"
    start, end = section_markers("g", "verdict")
    other_start, _ = section_markers("h", "verdict")
    words = {"start": start, "end": end, "other-start": other_start}
    lines = [words.get(kind, f"user paragraph {i}") for i, kind in enumerate(layout)]
    text = "\n".join(lines) + "\n"
    path.write_text(text)
    try:
        write_section(path, "g", "| the verdict |\n", kind="verdict")
    except ValueError as error:
        assert "line" in str(error) and path.read_text() == text
        return
    after = path.read_text()
    assert after.count(start) == 1 and after.count(end) == 1 and "| the verdict |" in after
    kept = [line for line in lines if line.startswith("user")]
    if start in text:  # replaced between the pair: what lay between was the old block
        i, j = lines.index(start), lines.index(end)
        kept = [line for k, line in enumerate(lines) if line.startswith("user") and not i < k < j]
    assert all(line in after for line in kept)


def test_the_verdict_writer_replaces_the_file_at_once(tmp_path, monkeypatch):
    """A failure mid-write (a kill, a full disk) leaves the old file whole and no temporary file behind."""
    import os

    from lanpo.experiments.stats import write_section

    path = tmp_path / "results.md"
    path.write_text("my notes\n" * 1000)

    def fail(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", fail)
    with pytest.raises(OSError):
        write_section(path, "g", "| table |\n", kind="verdict")
    assert path.read_text() == "my notes\n" * 1000
    assert [p.name for p in tmp_path.iterdir()] == ["results.md"]


def _write_evals(run, evals):
    """A cell's metrics.jsonl: the held-out mean@2 at each step of ``evals``, 5 s a training step."""
    rows = [
        {"step": s, "eval/arith/zero-shot/mean@2": v, **({"step_time": 5.0} if s else {})} for s, v in evals.items()
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def _finished_cell(grid, arm, seed, evals, config=None):
    """A cell finished in OUT as `lanpo train` and the runner leave one, without training."""
    run = grid.run_dir(arm, seed)
    run.mkdir(parents=True)
    _write_evals(run, evals)
    (run / "config.yaml").write_text(yaml.safe_dump(grid.config(arm, seed)))
    record = {"arm": arm, "seed": seed, "config": config or experiment.config_hash(grid.config(arm, seed))}
    (run / "cell.json").write_text(json.dumps(record) + "\n")


def test_a_recorded_grid_needs_no_out_to_skip_its_cells_or_write_its_tables(tmp_path, monkeypatch):
    grid_file = tiny_grid(tmp_path, tmp_path / "no-model", record=str(tmp_path / "record"))
    grid = load_grid(grid_file)
    for seed, lanpo in ((0, 0.35), (1, 0.25)):
        _finished_cell(grid, "grpo", seed, {0: 0.2, 1: 0.3, 2: 0.4})
        _finished_cell(grid, "lanpo", seed, {0: 0.2, 1: lanpo, 2: lanpo + 0.1})
    plot = tmp_path / "docs" / "tiny.png"
    assert main(["experiment", str(grid_file), "--table-only", "--plot", str(plot)]) == 0  # records finished cells
    assert plot.read_bytes() == (grid.out / "results.png").read_bytes()
    for arm, seed in grid.cells():
        kept = grid.record_dir(arm, seed)
        assert sorted(p.name for p in kept.iterdir()) == ["cell.json", "config.yaml", "metrics.jsonl"]
        assert (kept / "metrics.jsonl").read_bytes() == (grid.run_dir(arm, seed) / "metrics.jsonl").read_bytes()
    tables = [(grid.out / name).read_text() for name in ("results.md", "verdict.md")]
    shutil.rmtree(grid.out)  # another machine, another sitting: the scratch space is gone
    ran = []
    monkeypatch.setattr(experiment, "run_cell", lambda g, arm, seed, *a: ran.append((arm, seed)) or True)
    assert main(["experiment", str(grid_file)]) == 0
    assert ran == []  # every cell complete by its record
    assert [(grid.out / name).read_text() for name in ("results.md", "verdict.md")] == tables


def test_a_cell_recorded_with_another_config_is_refused_and_an_unrecorded_one_runs(tmp_path, monkeypatch):
    grid_file = tiny_grid(tmp_path, tmp_path / "no-model", record=str(tmp_path / "record"), seeds=[0])
    grid = load_grid(grid_file)
    _finished_cell(grid, "grpo", 0, {0: 0.2, 1: 0.3}, config="0123456789abcdef")
    assert experiment.record_cell(grid, "grpo", 0) and not experiment.record_cell(grid, "grpo", 0)  # once
    shutil.rmtree(grid.out)
    assert experiment.cell_state(grid, "grpo", 0) == "changed"
    assert experiment.cell_state(grid, "lanpo", 0) == "new"
    with pytest.raises(GridError, match="grpo/seed-0"):
        experiment.run_grid(grid)
    ran = []
    monkeypatch.setattr(experiment, "run_cell", lambda g, arm, seed, *a: ran.append((arm, seed)) or True)
    monkeypatch.setattr(experiment, "validate", lambda g, cells: None)
    experiment.run_grid(grid, arms=["lanpo"])
    assert ran == [("lanpo", 0)]


def test_a_cell_that_finishes_is_recorded_and_a_grid_without_a_record_writes_none(tmp_path):
    for record in (None, tmp_path / "record"):
        extra = {"record": str(record)} if record else {}
        grid = load_grid(tiny_grid(tmp_path, tmp_path / "no-model", out=str(tmp_path / f"out-{bool(record)}"), **extra))
        _finished_cell(grid, "grpo", 0, {0: 0.2, 1: 0.3})
        assert experiment.record_cell(grid, "grpo", 0) is bool(record)
        assert experiment.record_cell(grid, "lanpo", 0) is False  # nothing finished
        assert grid.result_dir("grpo", 0) == grid.run_dir("grpo", 0)  # OUT first while it holds the run
    assert sorted(p.name for p in (tmp_path / "record").rglob("*") if p.is_file()) == [
        "cell.json",
        "config.yaml",
        "metrics.jsonl",
    ]


def test_every_recorded_cell_still_matches_its_grid():
    """The grids whose cells are kept in results/ still give each recorded cell the config hash it ran under, and
    their run configs carry their pins (defaults that moved since: a cell run today runs as the recorded ones)."""
    root = Path(__file__).resolve().parents[1]
    checked = 0
    for grid_file in sorted((root / "configs" / "experiments").glob("*.yaml")):
        grid = load_grid(grid_file)
        if grid.record is None or not (root / grid.record).is_dir():
            continue
        for done in sorted((root / grid.record).glob("*/seed-*/cell.json")):
            record = json.loads(done.read_text())
            assert record["config"] == experiment.config_hash(grid.hashed_config(record["arm"], record["seed"])), done
            assert grid.config(record["arm"], record["seed"]).items() >= grid.pinned.items()
            checked += 1
    assert checked >= 40  # five recorded grids


def test_a_pin_runs_every_cell_with_its_value_and_leaves_the_hash_as_it_was(tmp_path):
    before = load_grid(tiny_grid(tmp_path, tmp_path / "no-model"))
    pinned = load_grid(tiny_grid(tmp_path, tmp_path / "no-model", pinned={"data": "builtin:arith?n=8&levels=1"}))
    assert pinned.config("lanpo", 0)["data"] == "builtin:arith?n=8&levels=1"
    assert experiment.config_hash(pinned.hashed_config("lanpo", 0)) == experiment.config_hash(before.config("lanpo", 0))
    child = tmp_path / "child.yaml"
    child.write_text(yaml.safe_dump({"name": "child", "extends": "grid.yaml"}))
    assert load_grid(child).pinned == {}  # a pin is its own grid's history
    with pytest.raises(GridError, match="which pinned sets"):
        load_grid(tiny_grid(tmp_path, tmp_path / "no-model", pinned={"feedback_ratio": 0.5}))


def test_the_record_is_the_grids_own_and_never_inherited(tmp_path):
    parent = tiny_grid(tmp_path, tmp_path / "no-model", record="results/tiny")
    child = tmp_path / "child.yaml"
    child.write_text(yaml.safe_dump({"name": "child", "extends": parent.name}))
    assert load_grid(parent).record == Path("results/tiny")
    assert load_grid(child).record is None


def test_a_cells_files_are_recorded_byte_for_byte_even_when_they_are_not_text(tmp_path):
    grid = load_grid(tiny_grid(tmp_path, tmp_path / "no-model", record=str(tmp_path / "record")))
    _finished_cell(grid, "grpo", 0, {0: 0.2, 1: 0.3})
    metrics = grid.run_dir("grpo", 0) / "metrics.jsonl"
    metrics.write_bytes(metrics.read_bytes() + b'{"step": 2, "note": "\xff\xfe"}\n')  # a torn, undecodable line
    assert experiment.record_cell(grid, "grpo", 0)
    assert (grid.record_dir("grpo", 0) / "metrics.jsonl").read_bytes() == metrics.read_bytes()
    assert not list(grid.record_dir("grpo", 0).glob(".*.tmp"))


def test_reuse_counts_another_grids_finished_cells_only_where_their_config_is_this_cells(tmp_path, monkeypatch):
    first_dir, second_dir = tmp_path / "first", tmp_path / "second"
    first_dir.mkdir(), second_dir.mkdir()
    first = load_grid(tiny_grid(first_dir, tmp_path / "no-model", record=str(first_dir / "record")))
    for seed in (0, 1):
        _finished_cell(first, "grpo", seed, {0: 0.2, 1: 0.3, 2: 0.4})
    assert experiment.record_cell(first, "grpo", 0) and experiment.record_cell(first, "grpo", 1)
    shutil.rmtree(first.out)  # read from the first grid's record
    spec = yaml.safe_load((first_dir / "grid.yaml").read_text())
    spec.update(name="second", out=str(second_dir / "out"), reuse={"grpo": str(first_dir / "grid.yaml")})
    spec["arms"] = {"grpo": {"feedback_ratio": 0.0}, "scored": {"feedback_route": "score", "feedback_source": "gold"}}
    (second_dir / "grid.yaml").write_text(yaml.safe_dump({k: v for k, v in spec.items() if k != "record"}))
    second = load_grid(second_dir / "grid.yaml")
    assert experiment.cell_state(second, "grpo", 0) == "complete"
    assert second.result_dir("grpo", 1) == first.record_dir("grpo", 1)
    assert experiment.cell_state(second, "scored", 0) == "new"
    ran = []
    monkeypatch.setattr(experiment, "run_cell", lambda g, arm, seed, *a: ran.append((arm, seed)) or True)
    monkeypatch.setattr(experiment, "validate", lambda g, cells: None)
    experiment.run_grid(second)
    assert sorted(ran) == [("scored", 0), ("scored", 1)]  # the reused cells never run again
    # a grpo arm that differs in any setting is its own cell
    spec["arms"]["grpo"] = {"feedback_ratio": 0.0, "learning_rate": 0.5}
    (second_dir / "grid.yaml").write_text(yaml.safe_dump({k: v for k, v in spec.items() if k != "record"}))
    assert experiment.cell_state(load_grid(second_dir / "grid.yaml"), "grpo", 0) == "new"
    spec["reuse"] = {"nosuch": str(first_dir / "grid.yaml")}
    (second_dir / "grid.yaml").write_text(yaml.safe_dump({k: v for k, v in spec.items() if k != "record"}))
    with pytest.raises(GridError, match="reuse names 'nosuch'"):
        load_grid(second_dir / "grid.yaml")


# -- windows: a training metric over a window of steps, the mechanism a decision rule reads ---------------------


def _series_cell(values: dict[int, float], metric: str = "lanpo/feedback_lift/abstraction") -> dict:
    return {**_cell({0: 0.1}, {0: 0.0}), "series": {metric: values}}


@settings(max_examples=60, deadline=None)
@given(
    lifts=st.lists(
        st.dictionaries(st.integers(1, 30), st.floats(-1, 1, allow_nan=False), max_size=30), min_size=2, max_size=5
    ),
    shift=st.floats(-0.5, 0.5, allow_nan=False),
    first=st.integers(1, 30),
    width=st.integers(0, 29),
)
def test_a_window_is_each_cells_mean_over_its_steps_then_over_seeds_paired_with_its_arm(lifts, shift, first, width):
    """Each arm's column is the mean over seeds of each cell's mean over the window, computed directly here; the
    paired column is the arm's cell minus the other arm's, seed by seed; a cell with no step in the window is left
    out of both."""
    from lanpo.experiments.grid import Grid, Window
    from lanpo.experiments.stats import window_table

    last = min(30, first + width)
    metric = "lanpo/feedback_lift/abstraction"
    seeds = list(range(len(lifts)))
    grid = Grid(name="g", arms={"grpo": {}, "lanpo": {}, "lift": {}}, seeds=seeds, out=Path("unused"), reference="grpo")
    grid.windows = [Window(metric, first, last, against="lanpo")]
    results = {
        "grpo": {s: _cell({0: 0.1}, {0: 0.0}) for s in seeds},  # logs no lift: "not logged", no seed
        "lanpo": {s: _series_cell(v) for s, v in enumerate(lifts)},
        "lift": {s: _series_cell({k: x + shift for k, x in v.items()}) for s, v in enumerate(lifts)},
    }
    title = f"over steps {first}-{last}" if first < last else f"at step {first}: each cell's value"
    rows = {r[0]: r[1:] for r in _section_rows(window_table(grid, results), title, "arm")}
    inside = [[x for k, x in v.items() if first <= k <= last] for v in lifts]
    own = [sum(x) / len(x) for x in inside if x]
    assert rows["lanpo"][1] == str(len(own)) and rows["lanpo"][3] == "reference"
    assert rows["lift"][1] == str(len(own)) and rows["grpo"][1] == "0" and rows["grpo"][4] == "not logged"
    if own:
        assert rows["lanpo"][0] == _fmt(*mean_ci(own)[:2], None, signed=True)
        shifted = [m + shift for m in own]
        assert rows["lift"][0] == _fmt(*mean_ci(shifted)[:2], None, signed=True)
        diffs = [b - a for a, b in zip(own, shifted)]
        assert rows["lift"][3] == _fmt(*mean_ci(diffs)[:2], None, signed=True)
        assert rows["lanpo"][2] == ", ".join(f"{m:+.3f}" for m in own)
    else:
        assert rows["lanpo"][0] == "—" and rows["lift"][3] == "—"


def test_the_runner_reads_a_windows_metric_from_each_cells_log_and_writes_it_beside_the_verdict(tmp_path, monkeypatch):
    """From the metrics files of finished cells: values that are not finite numbers are left out, and the
    verdict file holds the window's table after the held-out one."""
    from lanpo.experiments.stats import COMPLETE

    spec = {
        "name": "w",
        "arms": {"grpo": {"feedback_ratio": 0.0}, "lanpo": {}},
        "seeds": [0, 1],
        "out": str(tmp_path / "out"),
        "windows": [{"metric": "lanpo/feedback_lift", "steps": [2, 3], "against": "grpo"}],
    }
    path = tmp_path / "w.yaml"
    path.write_text(yaml.safe_dump(spec))
    grid = load_grid(path)
    logged = {
        ("grpo", 0): {1: 0.5, 2: 0.1, 3: 0.3},
        ("grpo", 1): {2: 0.2, 3: "nan"},
        ("lanpo", 0): {2: -0.1, 3: -0.3, 4: 9.0},
        ("lanpo", 1): {2: "abc", 3: 0.0},
    }
    for (arm, seed), values in logged.items():
        run = grid.run_dir(arm, seed)
        run.mkdir(parents=True)
        rows = [{"step": 0, WALL_METRIC: 0.1}] + [
            {"step": k, "step_time": 1.0, "lanpo/feedback_lift": v} for k, v in values.items()
        ]
        rows.append({"step": 4, WALL_METRIC: 0.2 if arm == "grpo" else 0.25})
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (run / COMPLETE).write_text(json.dumps({"config": experiment.config_hash(grid.config(arm, seed))}))
    monkeypatch.setattr(experiment, "validate", lambda g, cells: None)
    experiment.run_grid(grid, table_only=True)
    verdict = (grid.out / "verdict.md").read_text()
    assert verdict.index("each arm against `grpo`") < verdict.index("`lanpo/feedback_lift` over steps 2-3")
    rows = {r[0]: r[1:] for r in _section_rows(verdict, "over steps 2-3", "arm")}
    assert rows["grpo"][2] == "+0.200, +0.200" and rows["lanpo"][2] == "-0.200, +0.000"
    assert rows["lanpo"][3] == _fmt(*mean_ci([-0.4, -0.2])[:2], None, signed=True)
