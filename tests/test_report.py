"""Evaluation during training, report_to with a local tracker, and `lanpo report` opened in a real headless Chromium."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from helpers.browser import CHROMIUM
from lanpo.cli import main as lanpo
from lanpo.pool.store import ExperiencePool
from test_trainer import make_trainer, stub_summaries


@pytest.fixture(scope="module")
def trained_run(tiny_model_dir, tmp_path_factory):
    """A 3-step LANPO run with evaluation every 2 steps, logged to TensorBoard, its pool filled by canned summaries."""
    pytest.importorskip("tensorboard")
    tmp = tmp_path_factory.mktemp("report")
    trainer = make_trainer(
        tiny_model_dir,
        tmp,
        max_steps=3,
        eval_every=2,
        eval_benchmarks="builtin:arith?split=test",
        eval_limit=4,
        eval_k=2,
        eval_modes="zero-shot,retrieval",
        report_to="tensorboard",
        log_samples=8,
    )  # TensorBoard logs under RUN/runs/
    stub_summaries(trainer)
    trainer.train()
    return Path(trainer.args.output_dir)


def rows(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_evaluation_during_training_is_logged_at_step_zero_and_every_n_steps(trained_run):
    evals = [r for r in rows(trained_run / "metrics.jsonl") if any(k.startswith("eval/") for k in r)]
    assert [r["step"] for r in evals] == [0, 2]
    for r in evals:
        assert 0.0 <= r["eval/arith/zero-shot/mean@2"] <= 1.0 and "eval/arith/zero-shot/mean@2_stderr" in r
        assert 0.0 <= r["eval/arith/retrieval/context_rate"] <= 1.0
    train_rows = [r for r in rows(trained_run / "metrics.jsonl") if "loss" in r]
    assert len(train_rows) == 3 and all("lanpo/feedback_share" in r for r in train_rows)  # training logs intact


def test_evaluation_does_not_change_training(tiny_model_dir, tmp_path):
    """Sampling for evaluation runs under a forked RNG: the same seed trains to the same weights with or without it."""
    import torch

    plain = make_trainer(tiny_model_dir, tmp_path, name="plain", max_steps=2)
    plain.train()
    evaluated = make_trainer(
        tiny_model_dir,
        tmp_path,
        name="eval",
        max_steps=2,
        eval_every=1,
        eval_benchmarks="builtin:arith?split=test",
        eval_limit=2,
        eval_k=1,
    )
    evaluated.train()
    for a, b in zip(plain.model.parameters(), evaluated.model.parameters()):
        assert torch.equal(a, b)


def test_report_to_tensorboard_receives_the_lanpo_and_eval_metrics(trained_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    files = list(trained_run.rglob("events.out.tfevents.*"))
    assert files
    tags = set()
    for f in files:
        acc = EventAccumulator(str(f))
        acc.Reload()
        tags |= set(acc.Tags()["scalars"])
    for expected in (
        "train/lanpo/feedback_share",
        "train/lanpo/pool_size",
        "train/time/generate",
        "train/eval/arith/zero-shot/mean@2",
    ):
        assert expected in tags, sorted(tags)


def test_samples_log_whole_groups_with_their_real_prompts(trained_run):
    samples = rows(trained_run / "samples.jsonl")
    by_group = {}
    for s in samples:
        by_group.setdefault((s["step"], s["group"]), []).append(s)
    assert all(len(g) == 4 for g in by_group.values())  # G = 4: log_samples 8 = two whole groups a step
    feedback = [s for s in samples if s["feedback"]]
    assert feedback and all(s["prompt"] != s["problem"] and s["problem"] in s["prompt"] for s in feedback)


def test_report_is_one_self_contained_file_with_every_part(trained_run, tmp_path):
    out = tmp_path / "report.html"
    assert lanpo(["report", str(trained_run), "--out", str(out)]) == 0
    text = out.read_text()
    assert not re.search(r"""(src|href)=["']?https?:""", text) and "<link" not in text  # nothing fetched
    data = json.loads(
        re.search(r'<script type="application/json" id="lanpo-data">(.*?)</script>', text, re.S)
        .group(1)
        .replace("<\\/", "</")
    )
    run = data["runs"][0]
    assert run["pool"]["entries"] and run["groups"] and "eval/arith/zero-shot/mean@2" in run["metrics"]
    assert run["config"] and len(run["metrics"]["reward"]) == 3


def test_report_of_a_large_run_is_cut_and_says_so(trained_run, tmp_path, monkeypatch):
    import lanpo.report.page

    monkeypatch.setattr(lanpo.report.page, "MAX_GROUPS", 2)
    monkeypatch.setattr(lanpo.report.page, "MAX_ENTRIES", 1)
    monkeypatch.setattr(lanpo.report.page, "MAX_TEXT", 20)
    run = lanpo.report.page.collect(trained_run)
    assert len(run["groups"]) == 2 and run["total_groups"] > 2
    assert len(run["pool"]["entries"]) == 1 and run["pool"]["total_entries"] > 1
    newest = ExperiencePool(trained_run / "pool.sqlite", readonly=True).entries()[-1]
    assert run["pool"]["entries"][0]["id"] == newest.id  # the newest are kept
    prompts = [r["prompt"] for g in run["groups"] for r in g["rows"]]
    assert all(len(p) <= 20 or (len(p.split(" [... ")[0]) == 20 and p.endswith("more characters]")) for p in prompts)
    assert any("more characters]" in p for p in prompts)


def test_report_refuses_a_directory_that_is_not_a_run(tmp_path, capsys):
    assert lanpo(["report", str(tmp_path)]) == 2
    assert "metrics.jsonl" in capsys.readouterr().err


def _many_groups(run: Path, tmp_path: Path) -> Path:
    """A copy of ``run`` whose samples.jsonl repeats its groups at later steps: more groups than one page holds."""
    copy = tmp_path / "many"
    shutil.copytree(run, copy)
    samples = rows(run / "samples.jsonl")
    with (copy / "samples.jsonl").open("a") as f:
        for k in range(1, 5):
            f.writelines(json.dumps({**s, "step": s["step"] + 100 * k}) + "\n" for s in samples)
    return copy


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (make test installs it when apt-get can)")
def test_report_in_headless_chromium_a_user_searches_the_pool_and_clicks_through_the_rollouts(trained_run, tmp_path):
    """Driven as a user drives it (real clicks, typed text) over the DevTools protocol: no console error or
    uncaught exception on any tab, the search box finds exactly the entries whose text holds the query, the
    rollouts' pager and filters work; screenshots saved (runs/test-screenshots/)."""
    from helpers.browser import Browser

    run = _many_groups(trained_run, tmp_path)
    out = tmp_path / "report.html"
    assert lanpo(["report", str(run), "--out", str(out)]) == 0
    with ExperiencePool(run / "pool.sqlite", readonly=True) as pool:
        entries = pool.entries()
    target = entries[-1]
    query = target.problem_id.lower()  # the page's filter: any of these fields contains the query
    expected = {
        e.id
        for e in entries
        if query in " ".join([e.problem, e.flow_of_thought, *e.principles, *e.pitfalls, e.problem_id]).lower()
    }
    keep = Path(__file__).resolve().parents[1] / "runs" / "test-screenshots"
    keep.mkdir(parents=True, exist_ok=True)
    shown_ids = "[...document.querySelectorAll('.entry h3')].map(h => +h.textContent.match(/entry #(\\d+)/)[1])"
    with Browser() as browser:
        browser.open(out.as_uri())
        assert browser.js("document.querySelectorAll('svg[role=img]').length") >= 10
        assert browser.js("document.getElementById('main').innerText").count("Held-out evaluation") == 1

        browser.click("#tabs button", "Pool")
        browser.wait_for("document.querySelector('.pool-search')")
        assert set(browser.js(shown_ids)) == {e.id for e in entries}
        browser.type(".pool-search", target.problem_id)
        browser.wait_for(f"{shown_ids}.length === {len(expected)}")
        assert set(browser.js(shown_ids)) == expected and target.id in expected and len(expected) < len(entries)
        browser.screenshot(keep / "report-pool.png")

        browser.click("#tabs button", "Rollouts")
        browser.wait_for("document.querySelector('.group')")
        assert "with feedback" in browser.js("document.getElementById('main').innerText")
        groups = len({(s["step"], s["group"]) for s in rows(run / "samples.jsonl")})
        pager = "document.querySelector('.pager').textContent"
        assert f"{groups} shown" in browser.js(pager) and "page 1 of 3" in browser.js(pager)
        first = browser.js("document.querySelector('.group h3').textContent")
        browser.click(".pager button", "next")
        browser.wait_for(f"{pager}.includes('page 2 of 3')")
        assert browser.js("document.querySelector('.group h3').textContent") != first
        browser.screenshot(keep / "report-rollouts.png")
        browser.click(".pager button", "previous")
        browser.wait_for(f"{pager}.includes('page 1 of 3')")

        kinds = {s["kind"] for s in rows(run / "samples.jsonl") if s["feedback"]}
        for kind in kinds:
            browser.select("#main select", kind)
            shown = browser.js("[...document.querySelectorAll('.group')].map(g => g.innerHTML)")
            assert shown and all(f'class="kind {kind}"' in g for g in shown)
        browser.select("#main select", "any kind")
        browser.select("#main select", "none correct", index=1)
        wanted = sum(not any(r["correct"] for r in g) for g in _by_group(rows(run / "samples.jsonl")).values())
        assert f"{wanted} shown" in browser.js(pager)

        browser.click("#tabs button", "Evaluation")
        browser.wait_for("document.body.dataset.tab === 'Evaluation'")
        text = browser.js("document.getElementById('main').innerText")
        assert "During training" in text and "arith/zero-shot/mean@2" in text and "±" in text
        assert not browser.errors(), browser.errors()

        browser.open(out.as_uri() + "#tab=Pool&search=" + target.problem_id)  # a link to a search
        assert set(browser.js(shown_ids)) == expected and not browser.errors()
    assert (keep / "report-pool.png").stat().st_size > 10_000


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (make test installs it when apt-get can)")
@pytest.mark.parametrize("where", ["run directory", "during training"])
def test_the_held_out_panel_draws_each_evaluations_interval_on_an_axis_the_noise_cannot_fill(tmp_path, where):
    """The demo's two evaluations (+0.021, each with s.e. 0.027) are drawn with their 95% intervals, on an axis that
    holds both intervals and spans at least four half-intervals: the change reads as inside the noise, not as a climb."""
    from helpers.browser import Browser

    run = tmp_path / "demo"
    run.mkdir()
    evals = {0: (0.300, 0.027), 8: (0.321, 0.027)}
    metrics = [{"step": step, "reward/scratch/mean": 0.3} for step in range(1, 9)]
    if where == "during training":
        for step, (mean, se) in evals.items():
            metrics.append(
                {"step": step, "eval/arith/zero-shot/mean@4": mean, "eval/arith/zero-shot/mean@4_stderr": se}
            )
    else:
        for name, model, (mean, se) in (
            ("eval-before", "smollm2", evals[0]),
            ("eval-after", str(run / "final"), evals[8]),
        ):
            (run / name).mkdir()
            result = {
                "model": model,
                "data": "builtin:arith",
                "modes": {"zero-shot": {"metrics": {"mean@4": mean, "mean@4_stderr": se}}},
            }
            (run / name / "results.json").write_text(json.dumps(result))
    (run / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    out = tmp_path / "report.html"
    assert lanpo(["report", str(run), "--out", str(out)]) == 0
    card = "[...document.querySelectorAll('.card')].find(c => c.querySelector('h3').textContent.startsWith('Held-out'))"
    with Browser() as browser:
        browser.open(out.as_uri())
        assert browser.js(f"{card}.querySelectorAll('path.interval').length") == 2
        ticks = browser.js(
            f"[...{card}.querySelectorAll('svg text')].filter(t => t.getAttribute('text-anchor') === 'end').map(t => +t.textContent)"
        )
        lows, highs = [m - 1.96 * se for m, se in evals.values()], [m + 1.96 * se for m, se in evals.values()]
        assert min(ticks) <= min(lows) and max(ticks) >= max(highs)  # every interval inside the axis
        assert max(ticks) - min(ticks) >= max(0.2, 4 * 1.96 * 0.027) - 1e-3  # ticks are written to 3 places
        assert "95% interval" in browser.js(f"{card}.innerText") and not browser.errors()


def _by_group(samples: list[dict]) -> dict:
    groups: dict = {}
    for s in samples:
        groups.setdefault((s["step"], s["group"]), []).append(s)
    return groups


def test_demo_shows_a_pool_entry_and_a_feedback_rollout(trained_run):
    from lanpo.demo import show_method

    text = show_method(trained_run)
    assert "principles:" in text and "pitfalls:" in text and "--- prompt ---" in text and "--- completion ---" in text
    entry = ExperiencePool(trained_run / "pool.sqlite", readonly=True).entries()[-1]
    assert f"entry #{entry.id}" in text


def test_completions_table_logs_each_rows_real_prompt(tiny_model_dir, tmp_path):
    trainer = make_trainer(
        tiny_model_dir, tmp_path, max_steps=2, reflection_share=1.0, log_completions=True
    )  # step 1 reflects
    trainer.train()
    prompts = [p[-1]["content"] for p in trainer._logs["prompt"]]
    assert any("Earlier attempt" in p for p in prompts)  # reflection rows: their feedback prompt, not the plain one
    assert any("Earlier attempt" not in p for p in prompts)  # scratch rows: the plain prompt


@given(
    st.lists(
        st.tuples(st.sampled_from(["feedback", "scratch", "reflection", "abstraction"]), st.floats(0, 1)),
        min_size=1,
        max_size=20,
    ),
    st.data(),
)
def test_reward_is_accuracy_holds_exactly_when_every_kind_agrees_at_every_step(points, data):
    from lanpo.run.files import reward_is_accuracy

    rows = [{"step": i, f"reward/{kind}/mean": v, f"accuracy/{kind}/mean": v} for i, (kind, v) in enumerate(points)]
    assert reward_is_accuracy(rows)
    row = data.draw(st.sampled_from(rows))
    key = next(k for k in row if k.startswith("reward/"))
    row[key] += data.draw(st.sampled_from([0.25, -0.5, 1e-3]))  # a shaped reward (format bonus, penalty)
    assert not reward_is_accuracy(rows)


def test_reward_and_accuracy_share_one_chart_only_when_every_run_has_them_equal(trained_run, tmp_path):
    import lanpo.report.page

    shaped = lanpo.report.page.collect(trained_run)
    assert not shaped["reward_is_accuracy"]  # this run's reward adds a length bonus to the verifier's 0/1
    binary = tmp_path / "binary"
    binary.mkdir()
    rows = [
        {
            "step": s,
            "reward/feedback/mean": v,
            "accuracy/feedback/mean": v,
            "reward/scratch/mean": 1 - v,
            "accuracy/scratch/mean": 1 - v,
        }
        for s, v in ((1, 0.25), (2, 0.5))
    ]
    (binary / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    binary = lanpo.report.page.collect(binary)
    assert binary["reward_is_accuracy"]
    titles = [t for t, _ in lanpo.report.page.panels([binary])]
    assert any(t.startswith("Reward = accuracy") for t in titles) and not any(t.startswith("Accuracy") for t in titles)
    for runs in ([shaped], [binary, shaped]):
        titles = [t for t, _ in lanpo.report.page.panels(runs)]
        assert any(t.startswith("Accuracy") for t in titles) and not any("Reward = accuracy" in t for t in titles)


def test_evaluations_in_the_run_directory_are_listed_in_the_order_they_were_written(tmp_path):
    import os

    import lanpo.report.page

    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "loss": 0.5}\n')
    for i, name in enumerate(["eval-before", "eval-after", "eval-checkpoint-10"]):  # not alphabetical
        (tmp_path / name).mkdir()
        results = tmp_path / name / "results.json"
        results.write_text(
            json.dumps(
                {
                    "model": name,
                    "data": "d",
                    "settings": {"k": 4},
                    "modes": {"zero-shot": {"metrics": {"mean@4": i / 4}}},
                }
            )
        )
        os.utime(results, (1_000_000 + i, 1_000_000 + i))
    (tmp_path / "eval-broken").mkdir()
    (tmp_path / "eval-broken" / "results.json").write_text("{not json")  # skipped, not a crash
    evals = lanpo.report.page.collect(tmp_path)["evals"]
    assert [e["name"] for e in evals] == ["eval-before", "eval-after", "eval-checkpoint-10"]
    assert [e["modes"]["zero-shot"]["mean@4"] for e in evals] == [0, 0.25, 0.5] and evals[0]["k"] == 4


def test_held_out_chart_draws_only_mean_at_k_and_the_table_gives_its_error_and_pass_at_k(trained_run):
    import lanpo.report.page

    run = lanpo.report.page.collect(trained_run)
    charts = dict(lanpo.report.page.panels([run]))
    assert charts["Held-out evaluation (mean@k)"] == ["eval/arith/retrieval/mean@2", "eval/arith/zero-shot/mean@2"]
    assert "eval/seconds" in charts["Time per phase (s)"]  # seconds never share an axis with accuracies
    assert all(k in run["metrics"] for keys in charts.values() for k in keys if k.startswith("eval/"))
    logged = [json.loads(x) for x in (trained_run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in run["eval_table"]] == [r["step"] for r in logged if "eval/seconds" in r] == [0, 2]
    for table_row, row in zip(run["eval_table"], (r for r in logged if "eval/seconds" in r)):
        assert table_row["cells"]["arith/zero-shot/mean@2"] == [
            row["eval/arith/zero-shot/mean@2"],
            row["eval/arith/zero-shot/mean@2_stderr"],
            row["eval/arith/zero-shot/pass@2"],
        ]


def test_report_serve_serves_the_written_file_on_a_free_port(trained_run, tmp_path):
    import sys
    import urllib.request

    out = tmp_path / "served.html"
    proc = subprocess.Popen(
        [sys.executable, "-m", "lanpo.cli", "report", str(trained_run), "--out", str(out), "--serve", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        lines = []
        while not any(line.startswith("Serving ") for line in lines):
            line = proc.stdout.readline()
            assert line, "".join(lines)  # the process ended before serving
            lines.append(line)
        url = re.search(r"(http://127\.0\.0\.1:\d+/served\.html)", lines[-1]).group(1)
        assert not url.startswith("http://127.0.0.1:0/")
        with urllib.request.urlopen(url, timeout=30) as response:
            assert response.read() == out.read_bytes()
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_report_serve_serves_the_report_alone_never_the_run_folder(tmp_path):
    """The run's pool, config and checkpoints lie beside report.html: none of them, nor a listing, is served."""
    import threading
    import urllib.error
    import urllib.request

    from lanpo.report.page import make_server

    (tmp_path / "pool.sqlite").write_bytes(b"SQLite format 3\0 private")
    (tmp_path / "config.yaml").write_text("hub_token: secret\n")
    (tmp_path / "checkpoint-1").mkdir()
    report = tmp_path / "report.html"
    report.write_text("<html>the report</html>")
    server = make_server(report, 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        for path in ("/", "/report.html", "/report.html?tab=pool"):
            with urllib.request.urlopen(base + path, timeout=30) as response:
                assert response.read() == report.read_bytes()
        for path in ("/pool.sqlite", "/config.yaml", "/checkpoint-1/", "/../report.html", "/%2e%2e/x", "/x/"):
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(base + path, timeout=30)
            assert refused.value.code == 404, path
    finally:
        server.shutdown()
        server.server_close()


def test_report_serve_names_a_busy_port(tmp_path):
    import socket

    from lanpo.report.page import make_server

    report = tmp_path / "report.html"
    report.write_text("<html></html>")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(OSError, match=f"port {port} is in use"):
            make_server(report, port)


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (make test installs it when apt-get can)")
def test_the_browser_helper_runs_in_a_fresh_process_whose_own_pipes_take_fds_3_and_4(tmp_path):
    import sys

    page = tmp_path / "page.html"
    page.write_text('<html><body data-tab="x"><p id="p">hello</p></body></html>')
    code = (
        f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r})\nfrom helpers.browser import Browser\n"
        f"with Browser() as b:\n    b.open({page.as_uri()!r})\n"
        "    print(b.js(\"document.getElementById('p').textContent\"))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "hello", done.stderr[-2000:]


def _run_with_evaluations_beside_it(folder: Path) -> Path:
    """A run with no evaluation during training, evaluated before and after as `make demo` does: the start model
    in RUN/eval-before, RUN/final in RUN/eval-after."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "loss": 0.1 * s}) + "\n" for s in (1, 2, 3)))
    for name, model, value in (("eval-before", "smollm2-135m", 0.25), ("eval-after", str(folder / "final"), 0.5)):
        (folder / name).mkdir()
        payload = {"model": model, "data": "builtin:arith?split=test", "settings": {"k": 4}}
        payload["modes"] = {"zero-shot": {"metrics": {"mean@4": value, "pass@4": value}}}
        (folder / name / "results.json").write_text(json.dumps(payload))
    return folder


def test_the_run_directorys_evaluations_stand_at_the_step_of_their_model(tmp_path):
    import lanpo.report.page

    run = _run_with_evaluations_beside_it(tmp_path / "demo")
    (run / "eval-mid").mkdir()
    (run / "eval-mid" / "results.json").write_text(
        json.dumps({"model": str(run / "checkpoint-2"), "modes": {"zero-shot": {"metrics": {"mean@4": 0.3}}}})
    )
    steps = {e["name"]: e["step"] for e in lanpo.report.page.collect(run)["evals"]}
    assert steps == {"eval-before": 0, "eval-after": 3, "eval-mid": 2}


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (make test installs it when apt-get can)")
def test_the_held_out_panel_shows_the_evaluations_before_and_after_when_none_ran_during_training(tmp_path):
    from helpers.browser import Browser

    run = _run_with_evaluations_beside_it(tmp_path / "demo")
    out = tmp_path / "report.html"
    assert lanpo(["report", str(run), "--out", str(out)]) == 0
    with Browser() as browser:
        browser.open(out.as_uri())
        text = browser.js("document.getElementById('main').innerText")
        assert "the run directory's evaluations" in text and "no evaluation during training" not in text
        points = browser.js(
            "[...document.querySelectorAll('svg[role=img]')].filter(s => s.getAttribute('aria-label')"
            ".startsWith('Held-out')).flatMap(s => [...s.querySelectorAll('circle title')].map(t => t.textContent))"
        )
        assert any("step 0: 0.250" in p for p in points) and any("step 3: 0.500" in p for p in points), points
        assert not browser.errors(), browser.errors()
