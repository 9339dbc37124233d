"""Final answers in text: where a solution states its answer, and the number formats shared by every reader.

Used by ``data`` (answers of data sets written as solutions) and ``rewards`` (answers of model outputs), so a
gold answer and a prediction are read by the same rules.
"""

from __future__ import annotations

import re

EXTRACTION_MODES = ("boxed", "lenient")

_THOUSANDS = re.compile(r"-?\d{1,3}(,\d{3})+(\.\d+)?")


def strip_thousands(text: str) -> str:
    """``1,234,567.5`` → ``1234567.5``; anything that is not such a number comes back unchanged."""
    return text.replace(",", "") if _THOUSANDS.fullmatch(text) else text


def gsm8k_answer(text: str) -> str | None:
    """GSM8K rationales end in ``#### 1,234``: keep the number, without thousands separators."""
    if "####" not in text:
        return None
    answer = text.rsplit("####", 1)[1].strip()
    return answer.replace(",", "").rstrip(".") or None


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``) in ``text``, braces balanced; ``None`` if absent."""
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    i = text.find("{", start)
    if i < 0:
        # \boxed 5 (no braces) is valid LaTeX for a single token
        match = re.match(r"\\(?:boxed|fbox)\s+([^\s$]+)", text[start:])
        return match.group(1) if match else None
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1 : j].strip()
    return None  # unbalanced


_NUMBER = r"-?\d+(?:,\d{3})*(?:\.\d+)?(?:/\d+)?"
_ANSWER_IS = re.compile(
    r"(?:final answer|the answer|answer)\s*(?:is|:|=)\s*\$?\s*(" + _NUMBER + r"|\\frac\{[^{}]*\}\{[^{}]*\})",
    re.IGNORECASE,
)


def extract_answer(text: str, mode: str = "lenient") -> str | None:
    """The final answer written in ``text``.

    ``boxed`` (strict): the content of the last ``\\boxed{}``. ``lenient``: that, else an explicit
    "the answer is X" / "#### X", else the last number in the text.
    """
    if mode not in EXTRACTION_MODES:
        raise ValueError(f"Unknown extraction mode {mode!r}; choose from {EXTRACTION_MODES}.")
    if not isinstance(text, str):
        return None
    boxed = last_boxed(text)
    if boxed is not None or mode == "boxed":
        return boxed or None
    matches = _ANSWER_IS.findall(text)
    if matches:
        return matches[-1]
    if "####" in text:
        tail = text.rsplit("####", 1)[1].strip().split("\n")[0].strip()
        if tail:
            return tail
    numbers = re.findall(_NUMBER, text)
    return numbers[-1] if numbers else None
