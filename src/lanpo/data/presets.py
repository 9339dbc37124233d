"""Data set presets: names that know their fields, answer formats, hub location and local file layout."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Preset:
    hub: str
    split: str = "test"
    config: str | None = None
    problem_field: str = "problem"
    answer_field: str = "answer"
    answer_format: str = "plain"
    local: dict[str, str] = field(default_factory=dict)  # split -> path under --data-dir
    local_answer_format: str | None = None  # when local files store answers differently from the hub


PRESETS: dict[str, Preset] = {
    "gsm8k": Preset(
        "openai/gsm8k",
        "test",
        "main",
        "question",
        "answer",
        "gsm8k",
        {"train": "gsm8k/train.jsonl", "test": "gsm8k/test.jsonl"},
    ),
    "math": Preset(
        "DigitalLearningGmbH/MATH-lighteval",
        "train",
        None,
        "problem",
        "solution",
        "boxed",
        {"train": "math_train/train.json", "test": "math500/test.jsonl"},
        local_answer_format="plain",
    ),
    "math500": Preset(
        "HuggingFaceH4/MATH-500", "test", None, "problem", "answer", "plain", {"test": "math500/test.jsonl"}
    ),
    "dapo-math-17k": Preset(
        "open-r1/DAPO-Math-17k-Processed",
        "train",
        "en",
        "prompt",
        "solution",
        "plain",
        {"train": "dapo_math_17k/train.jsonl"},
    ),
    "aime24": Preset(
        "HuggingFaceH4/aime_2024",
        "train",
        None,
        "problem",
        "answer",
        "plain",
        {"train": "aime24/test.jsonl", "test": "aime24/test.jsonl"},
    ),
    "aime25": Preset("math-ai/aime25", "test", None, "problem", "answer", "plain", {"test": "aime25/test.jsonl"}),
    "amc23": Preset("math-ai/amc23", "test", None, "question", "answer", "plain", {"test": "amc23/test.jsonl"}),
    "minerva": Preset(
        "math-ai/minervamath", "test", None, "question", "answer", "plain", {"test": "minerva/test.jsonl"}
    ),
    "olympiadbench": Preset(
        "math-ai/olympiadbench", "test", None, "question", "final_answer", "plain", {"test": "olympiadbench/test.jsonl"}
    ),
}
# Benchmarks are the presets used for evaluation (train-only sets excluded).
BENCHMARKS = ("gsm8k", "math500", "aime24", "aime25", "amc23", "minerva", "olympiadbench")


def training_split(spec: str, split: str | None = None) -> str | None:
    """The split training reads: the one named, else a preset's train split when it has one (a preset's own ``split``
    is the evaluation default: ``test`` for GSM8K, whose test split training must not read unasked); None leaves
    the choice to the loader (builtin:arith's train split, a hub set's ``train``, a file)."""
    preset = PRESETS.get(spec)
    if split or preset is None:
        return split
    return "train" if "train" in preset.local else preset.split


# The held-out benchmark of a preset trained on its train split (evaluation during training, when none is named).
HELD_OUT = {"gsm8k": "gsm8k", "math": "math500"}
