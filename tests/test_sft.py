"""The SFT seeding stage: data builder (stub teacher, HTTP teacher, resumption, no leakage) and SFT itself."""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
from hypothesis import given
from hypothesis import strategies as st

from helpers.audit import leakage_problems
from lanpo.commands.sft_data import EndpointTeacher, ShownBalance, build_sft_data
from lanpo.data.loaders import builtin_arith
from lanpo.feedback import LABEL_TALK
from lanpo.prompts import SUMMARY_PREFILL, parse_summary

PROBLEMS = builtin_arith("1", n=24, seed=3)
SUMMARY = (
    SUMMARY_PREFILL + " add the numbers.\nPRINCIPLES:\n- add the ones digits first\nPITFALLS:\n- forgetting to carry"
)


def _value(text: str) -> int | None:
    match = re.search(r"(\d+) ([+-]) (\d+)|sum of (\d+) and (\d+)|Subtract (\d+) from (\d+)", text)
    if not match:
        return None
    g = match.groups()
    if g[0]:
        return int(g[0]) + int(g[2]) if g[1] == "+" else int(g[0]) - int(g[2])
    if g[3]:
        return int(g[3]) + int(g[4])
    return int(g[6]) - int(g[5])


class StubTeacher:
    """Answers like a model would: some right, some wrong, some unparseable, some with label talk."""

    def __init__(self, fail_after: int | None = None):
        self.calls = 0
        self.fail_after = fail_after
        self.prompts: list = []

    def __call__(self, prompts):
        self.calls += 1
        if self.fail_after is not None and self.calls > self.fail_after:
            raise KeyboardInterrupt  # the build is interrupted mid-way
        replies = []
        for k, messages in enumerate(prompts):
            self.prompts.append(messages)
            text = messages[0]["content"]
            truth = _value(text.split("\n\n")[0] if text.startswith("Problem:") else text)
            if messages[-1]["role"] == "assistant":  # summary (prefilled)
                replies.append(SUMMARY if k % 3 else "no idea")
            elif "### Earlier attempt" in text:  # reflection
                replies.append(
                    f"The reward says so. \\boxed{{{truth}}}"
                    if k % 4 == 0
                    else f"Checking each step: fine. \\boxed{{{truth}}}"
                )
            elif "### Lesson" in text:  # using feedback
                replies.append(f"The first lesson applies. \\boxed{{{truth}}}")
            else:  # plain solving: wrong on every other try
                replies.append(f"\\boxed{{{truth if k % 2 else (truth or 0) + 1}}}")
        return replies


def test_builder_keeps_verified_parsed_examples_and_reports_drops(tmp_path):
    out = tmp_path / "sft.jsonl"
    report = build_sft_data(PROBLEMS, StubTeacher(), out, n=30, tries=2, batch_size=8, progress=False)
    examples = [json.loads(x) for x in out.read_text().splitlines()]
    kept = {s: sum(e["skill"] == s for e in examples) for s in ("summarize", "reflect", "feedback")}
    assert kept == dict(report.kept) and all(v > 0 for v in kept.values())
    assert sum(kept.values()) <= 30
    for e in examples:
        prompt, reply = e["prompt"][-1]["content"], e["completion"][0]["content"]
        problem = next(p for p in PROBLEMS if p.id == e["problem_id"])
        assert e["prompt"][-1]["role"] == "user" and e["completion"][0]["role"] == "assistant"
        if e["skill"] == "summarize":
            assert parse_summary(reply) is not None and reply.startswith(SUMMARY_PREFILL)
        else:
            assert f"\\boxed{{{problem.answer}}}" in reply  # verified answers only
        if e["skill"] == "reflect":
            attempt = prompt.split("### Earlier attempt\n", 1)[1].split("\n\nFirst, review")[0]
            assert not leakage_problems(prompt, problem.answer, [problem.problem, attempt])
            assert not LABEL_TALK.search(reply)
        if e["skill"] == "feedback":  # lessons of other problems: never a grade (their values are theirs)
            assert not leakage_problems(prompt, None, [problem.problem])
    assert report.dropped["reflect"].get("reply talks about rewards or reference answers", 0) >= 0
    assert report.as_dict()["kept"] == kept


def test_unparseable_summaries_and_label_talk_are_dropped_with_reasons(tmp_path):
    class Bad(StubTeacher):
        def __call__(self, prompts):
            replies = super().__call__(prompts)
            return [
                "garbage"
                if p[-1]["role"] == "assistant"
                else "The reward model says \\boxed{1}"
                if "### Earlier attempt" in p[0]["content"]
                else r
                for p, r in zip(prompts, replies)
            ]

    report = build_sft_data(PROBLEMS[:8], Bad(), tmp_path / "bad.jsonl", n=30, tries=2, batch_size=8, progress=False)
    assert report.kept["summarize"] == 0 and report.dropped["summarize"]["summary does not parse"] > 0
    assert report.kept["reflect"] == 0
    assert report.dropped["feedback"]["no lessons of other problems yet"] > 0


def test_interrupted_build_resumes_without_redoing_work(tmp_path):
    out = tmp_path / "resume.jsonl"
    with pytest.raises(KeyboardInterrupt):
        build_sft_data(PROBLEMS, StubTeacher(fail_after=6), out, n=45, tries=2, batch_size=4, progress=False)
    first = [json.loads(x) for x in out.read_text().splitlines()]
    assert first  # what was made before the interruption is kept
    report = build_sft_data(PROBLEMS, StubTeacher(), out, n=45, tries=2, batch_size=4, progress=False)
    examples = [json.loads(x) for x in out.read_text().splitlines()]
    assert examples[: len(first)] == first
    pairs = [(e["problem_id"], e["skill"]) for e in examples]
    assert len(pairs) == len(set(pairs))  # nothing built twice
    assert sum(report.kept.values()) == len(examples)


def test_invalid_mix_is_rejected(tmp_path):
    with pytest.raises(ValueError, match="mix"):
        build_sft_data(PROBLEMS, StubTeacher(), tmp_path / "x.jsonl", mix=(1, 1))


class _Handler(BaseHTTPRequestHandler):
    requests: list = []

    def do_POST(self):  # noqa: N802 - http.server API
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        _Handler.requests.append(body)
        if "FAIL" in body["messages"][0]["content"]:
            self.send_response(500)
            self.end_headers()
            return
        content = " continued" if body.get("continue_final_message") else "\\boxed{3}"
        payload = json.dumps({"choices": [{"message": {"role": "assistant", "content": content}}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args):
        pass


def test_openai_compatible_endpoint_teacher():
    server = HTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        teacher = EndpointTeacher(f"http://127.0.0.1:{server.server_port}/v1", "big-model", retries=1)
        replies = teacher(
            [
                [{"role": "user", "content": "1 + 2?"}],
                [{"role": "user", "content": "sum up"}, {"role": "assistant", "content": "FLOW:"}],
                [{"role": "user", "content": "FAIL please"}],
            ]
        )
    finally:
        server.shutdown()
    assert replies[0] == "\\boxed{3}"
    assert replies[1] == "FLOW: continued"  # the prefilled start is kept
    assert replies[2] == "" and teacher.failures == 1  # a failing endpoint drops the example, no crash
    assert any(r.get("continue_final_message") for r in _Handler.requests)
    assert all(r["model"] == "big-model" for r in _Handler.requests)


def test_sft_lowers_the_loss_and_its_model_trains_with_lanpo(tiny_model_dir, tmp_path):
    from lanpo.cli import main
    from lanpo.commands.sft import run_sft

    data = tmp_path / "sft.jsonl"
    build_sft_data(PROBLEMS, StubTeacher(), data, n=24, tries=2, batch_size=8, progress=False)
    final = run_sft(
        [
            "--data",
            str(data),
            "--model_name_or_path",
            str(tiny_model_dir),
            "--output_dir",
            str(tmp_path / "sft"),
            "--max_steps",
            "12",
            "--learning_rate",
            "3e-3",
            "--logging_steps",
            "1",
            "--per_device_train_batch_size",
            "4",
            "--disable_tqdm",
            "true",
            "--lr_scheduler_type",
            "constant",
            "--warmup_steps",
            "0",
        ]
    )
    assert (final / "config.json").is_file()
    log = [json.loads(x) for x in (tmp_path / "sft" / "metrics.jsonl").read_text().splitlines()]
    losses = [h["loss"] for h in log if "loss" in h]
    assert len(losses) == 12 and sum(losses[-3:]) / 3 < sum(losses[:3]) / 3
    assert (
        main(
            [
                "train",
                "--model",
                str(final),
                "--data",
                "builtin:arith?n=8",
                "--output_dir",
                str(tmp_path / "rl"),
                "--max_steps",
                "1",
                "--num_generations",
                "4",
                "--per_device_train_batch_size",
                "4",
                "--max_completion_length",
                "8",
                "--relevance_scorer",
                "bm25",
                "--disable_tqdm",
                "true",
            ]
        )
        == 0
    )


@given(st.lists(st.tuples(st.booleans(), st.booleans()), min_size=1, max_size=80))
def test_kept_reflections_show_right_attempts_at_the_candidates_rate(events):
    """Any order of candidates (shown attempt right?) and verified reflections: the kept share of right shown
    attempts is within one example of the candidates' share."""
    balance = ShownBalance()
    balance.candidates.update(right for right, _ in events)
    for right, verified in events:
        if verified and balance.admits(right):
            balance.kept[right] += 1
    kept = sum(balance.kept.values())
    share = balance.candidates[True] / len(events)
    assert abs(balance.kept[True] - share * kept) < 1 or kept == 0
    assert kept >= 1 or not any(verified for _, verified in events)  # the first verified one is always kept


def test_reflections_that_verify_mostly_when_shown_a_right_attempt_are_rebalanced(tmp_path):
    class Copier(StubTeacher):
        """Right on 1 try in 4; a reflection verifies when the shown attempt was right, else 1 time in 3."""

        def __call__(self, prompts):
            self.calls += 1
            replies = []
            for k, messages in enumerate(prompts):
                text = messages[0]["content"]
                truth = _value(text.split("\n\n")[0] if text.startswith("Problem:") else text)
                if messages[-1]["role"] == "assistant":
                    replies.append(SUMMARY)
                elif "### Earlier attempt" in text:
                    shown = text.split("### Earlier attempt\n", 1)[1].split("\n\nFirst, review")[0]
                    right = shown == f"\\boxed{{{truth}}}"
                    replies.append(f"\\boxed{{{truth if right or k % 3 == 0 else truth + 7}}}")
                elif "### Lesson" in text:
                    replies.append(f"\\boxed{{{truth}}}")
                else:
                    replies.append(f"\\boxed{{{truth if k % 4 == 0 else truth + 1}}}")
            return replies

    problems = builtin_arith("1", n=120, seed=5)
    out = tmp_path / "balanced.jsonl"
    report = build_sft_data(problems, Copier(), out, n=60, mix=(0, 1, 0), tries=1, batch_size=16, progress=False)
    shown = report.as_dict()["reflect_shown_attempt"]
    examples = [json.loads(x) for x in out.read_text().splitlines()]
    flags = [e["shown_attempt_right"] for e in examples]
    assert shown["kept"] == len(examples) > 10 and shown["kept_right_share"] == sum(flags) / len(flags)
    assert 0.1 < shown["candidates_right_share"] < 0.4  # about the base rate of 1 in 4
    assert abs(sum(flags) - shown["candidates_right_share"] * len(flags)) < 1  # unchecked: well over half right
    assert report.dropped["reflect"]["kept to the candidates' share of right shown attempts"] > 0
    resumed = build_sft_data(problems, Copier(), out, n=60, mix=(0, 1, 0), tries=1, batch_size=16, progress=False)
    assert resumed.as_dict()["reflect_shown_attempt"] == shown  # counts come back from the files


# -- round four (issue 50): a teacher that is away, files that are not ours -----------------------------------


def test_problems_the_teacher_gave_nothing_for_are_not_done_and_a_resume_builds_them(tmp_path):
    """Against an unreachable teacher every reply is empty: the build writes nothing, marks no problem done,
    and the resume with the teacher back builds what a fresh build would (it built 1 example instead of 81)."""
    out = tmp_path / "away.jsonl"
    away = build_sft_data(PROBLEMS, lambda prompts: [""] * len(prompts), out, n=45, tries=2, progress=False)
    assert away.written == 0 and away.teacher_failures > 0
    progress = out.with_name(out.name + ".progress.jsonl")
    assert not progress.exists() or progress.read_text() == ""  # nothing is done
    back = build_sft_data(PROBLEMS, StubTeacher(), out, n=45, tries=2, progress=False)
    fresh = build_sft_data(PROBLEMS, StubTeacher(), tmp_path / "fresh.jsonl", n=45, tries=2, progress=False)
    assert back.written == fresh.written > 10


def test_sft_data_against_an_unreachable_teacher_exits_2_saying_so(tmp_path, capsys):
    from lanpo.cli import main

    out = tmp_path / "x.jsonl"
    argv = ["sft-data", "--teacher-url", "http://127.0.0.1:9/v1", "--data", "builtin:arith?n=4", "--out", str(out)]
    assert main([*argv, "--tries", "1", "--n", "6", "--batch-size", "4"]) == 2
    err = capsys.readouterr().err
    assert "gave no reply" in err and "run the same command again" in err


@pytest.mark.parametrize(
    "garbage",
    [
        '[1, 2]\n"text"\n{"problem_id": 3, "skill": "reflect"}\n',
        "null\n{}\n",
        '{"skill": "dance", "problem_id": "p"}\n',
    ],
)
def test_output_and_progress_lines_that_are_not_records_are_skipped(tmp_path, garbage, caplog):
    out = tmp_path / "g.jsonl"
    out.write_text(garbage)
    out.with_name(out.name + ".progress.jsonl").write_text(garbage)
    report = build_sft_data(PROBLEMS, StubTeacher(), out, n=12, tries=2, progress=False)
    assert report.written > 0 and sum(report.kept.values()) == report.written
    assert str(out) in caplog.text


def test_a_binary_output_file_is_named_before_the_teacher_loads(tmp_path, capsys, monkeypatch):
    import lanpo.engine.generation
    from lanpo.cli import main

    monkeypatch.setattr(lanpo.engine.generation, "load_for_generation", lambda *a, **k: pytest.fail("loaded"))
    out = tmp_path / "x.jsonl"
    out.with_name(out.name + ".progress.jsonl").write_bytes(b"\xff\xfe\x00garbage")
    assert main(["sft-data", "--data", "builtin:arith?n=4", "--out", str(out)]) == 2
    assert "x.jsonl.progress.jsonl is not UTF-8 text" in capsys.readouterr().err
