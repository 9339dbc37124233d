"""Final answers in text: where a solution states its answer, what number it is, and whether it hedges.

Used by ``data`` (gold answers of data sets) and ``rewards`` (answers of model outputs), so a gold answer and a
prediction are read by the same rules. Every function here runs in time linear in its input (no regular
expression with nested or adjacent unbounded quantifiers), because extraction runs in the trainer's process,
outside the verifier's time limit.

Extraction modes:

* ``strict`` — the final ``\\boxed{}`` only. What real-model configs use.
* ``lenient`` — the final ``\\boxed{}``; else "the answer is X" / "#### X"; else the last number, never one
  that the completion copied from the problem statement. For the embedded default (a 135M model that rarely
  boxes); it is hackable (a policy can learn to end on a number), so prefer ``strict`` wherever a model boxes.

In both modes a completion that boxes several different values has no answer (a hedge), and
:func:`names_several_values` rejects a final answer that names more than one value (``2 \\text{ or } 3``,
``w = g``, ``a \\lor b``) where the gold is one value.
"""

from __future__ import annotations

import re
import unicodedata
from decimal import Decimal, localcontext
from fractions import Fraction

EXTRACTION_MODES = ("strict", "lenient")
_ALIASES = {"boxed": "strict"}  # the name of `strict` before 0.2

# -- characters ------------------------------------------------------------------------------------------------

_MINUS = "\u2212\u2013\u2012\u2010\ufe63\uff0d"  # minus sign, en dash, figure dash, hyphen, small/fullwidth minus


def _digit_table() -> dict[int, str]:
    table = {ord(c): "-" for c in _MINUS}
    for code in range(0x80, 0x10000):
        char = chr(code)
        if unicodedata.category(char) == "Nd":
            table[code] = str(unicodedata.digit(char))
    table.update({0x00D7: "\\times ", 0x22C5: "\\cdot ", 0x00A0: " ", 0x202F: " ", 0x2009: " ", 0x0000: ""})
    return table


_TABLE = _digit_table()


_BARE_FRAC = re.compile(r"\\([dt]?frac)[ \t]*(\\[A-Za-z]+|[0-9A-Za-z])[ \t]*(\\[A-Za-z]+|[0-9A-Za-z])")


def clean(text: str) -> str:
    """Unicode digits (``７``), minus signs (U+2212) and ``×`` in ASCII/LaTeX form, NUL bytes removed, and
    brace-less fractions braced (``\\frac\\pi 2`` → ``\\frac{\\pi}{2}``: math-verify misreads the bare form)."""
    return _BARE_FRAC.sub(r"\\\1{\2}{\3}", text.translate(_TABLE))


_THOUSANDS = re.compile(r"-?\d{1,3}(,\d{3})+(\.\d+)?")


def strip_thousands(text: str) -> str:
    """``1,234,567.5`` → ``1234567.5``; anything that is not such a number comes back unchanged."""
    return text.replace(",", "") if _THOUSANDS.fullmatch(text) else text


# -- numbers ---------------------------------------------------------------------------------------------------

_DECIMAL = re.compile(r"([+-]?)(\d{1,3}(?:,\d{3})+|\d{1,3}(?: \d{3})+|\d+)?(?:\.(\d+))?(?:[eE]([+-]?\d{1,4}))?")
_POWER = re.compile(r"(?:\\times|\\cdot|\*|x)\s*10\s*\^\s*(?:\{\s*([+-]?\d{1,4})\s*\}|([+-]?\d{1,4}))")
_WRAPPERS = re.compile(r"\\?\$|\\[,!;: ]|\\left|\\right|\\mathrm\{\s*\}|\\text\{\s*\}")
MAX_EXPONENT = 1000  # beyond this a number is left to math-verify (within its time limit)
_INT_POWER = re.compile(r"(\d{1,6})\s*\^\s*(?:\{\s*([+-]?\d{1,5})\s*\}|(\d))")
MAX_DEPTH = 64


def _strip(text: str) -> str:
    return _WRAPPERS.sub("", text).strip().rstrip(".").strip()


def _decimal(text: str) -> tuple[Fraction, int | None] | None:
    """``(value, significant digits)`` of ``12``, ``-0.5``, ``1,234``, ``4.5e33``, ``4.5 \\times 10^{33}``;
    significant digits are ``None`` for integers written without a decimal point or exponent (exact)."""
    power = _POWER.search(text)
    exponent = 0
    if power:
        if text[power.end():].strip():
            return None
        exponent = int(power.group(1) or power.group(2))
        text = text[:power.start()].strip() or "1"
    match = _DECIMAL.fullmatch(text)
    if not match or not (match.group(2) or match.group(3)):
        return None
    sign, whole, frac, exp = match.groups()
    whole = (whole or "0").replace(",", "").replace(" ", "")
    frac = frac or ""
    exponent += int(exp) if exp else 0
    if abs(exponent) > MAX_EXPONENT:
        return None
    value = Fraction(int(whole + frac), 10 ** len(frac)) * Fraction(10) ** exponent
    value = -value if sign == "-" else value
    if not frac and not exp and not power:
        return value, None
    digits = (whole + frac).lstrip("0")
    return value, max(1, len(digits)) if digits else None


def _braced(text: str, start: int) -> int:
    """Index just past the brace group opening at ``text[start] == "{"`` (-1 if unbalanced)."""
    depth = 0
    for i in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return i + 1
    return -1


def _number(text: str, depth: int = 0) -> tuple[Fraction, int | None] | None:
    if depth > MAX_DEPTH:
        return None
    text = _strip(text)
    for _ in range(4):  # {5}, {{5}}: a few levels (each check is linear)
        if not (text.startswith("{") and _braced(text, 0) == len(text)):
            break
        text = text[1:-1].strip()
    if text.startswith("(") and text.endswith(")") and "(" not in text[1:-1] and "," not in text:
        text = text[1:-1].strip()
    sign = -1 if text.startswith("-") and text[1:2] in ("\\", "{", "(") else 1
    body = text[1:].strip() if sign < 0 else text
    for command in ("\\frac", "\\dfrac", "\\tfrac"):
        if body.startswith(command):
            first = len(command)
            while first < len(body) and body[first] == " ":
                first += 1
            if first >= len(body) or body[first] != "{":
                return None
            middle = _braced(body, first)
            if middle < 0 or middle >= len(body) or body[middle] != "{" or _braced(body, middle) != len(body):
                return None
            top, bottom = _number(body[first + 1:middle - 1], depth + 1), _number(body[middle + 1:-1], depth + 1)
            if top is None or bottom is None or bottom[0] == 0:
                return None
            return sign * top[0] / bottom[0], None
    power = _INT_POWER.fullmatch(text)
    if power:  # 2^{98}: exact, so 1/2^98 and 2/2^98 never look equal (math-verify rounds to 6 places)
        base, exponent = _decimal(power.group(1)), int(power.group(2) or power.group(3))
        if base is None or base[1] is not None or abs(exponent) * len(power.group(1)) > 4 * MAX_EXPONENT or \
                (base[0] == 0 and exponent < 0):
            return None
        return base[0] ** exponent, None
    if "/" in text and text.count("/") == 1:
        top, bottom = (_number(part, depth + 1) for part in text.split("/"))
        if top is None or bottom is None or bottom[0] == 0 or top[1] or bottom[1]:
            return None
        return top[0] / bottom[0], None
    return _decimal(text)


def to_number(text: str) -> Fraction | None:
    """The exact value of a plain number written in ``text`` (integer, decimal, ``1,234``, ``4.5e33``,
    ``4.5 \\times 10^{33}``, ``a/b``, nested ``\\frac``), else ``None`` (an expression, a unit, a percent)."""
    if not isinstance(text, str) or len(text) > 2000 or "%" in text:
        return None
    parsed = _number(clean(text))
    return parsed[0] if parsed else None


def _round_sig(value: Fraction, digits: int) -> Decimal:
    with localcontext() as ctx:
        ctx.prec = max(digits, 1) + 50
        exact = Decimal(value.numerator) / Decimal(value.denominator)
        if exact == 0:
            return exact
        ctx.prec = digits
        return +exact


def numbers_match(gold: str, prediction: str) -> bool | None:
    """Whether two plain numbers agree (``None`` when either is not a plain number).

    Tolerance policy: equal values always match (``0.5`` = ``1/2`` = ``5e-1``). A decimal is taken as rounded to
    the digits it is written with: two numbers match when they agree to the precision of the less precise one,
    and that precision is at least 2 significant digits (``0.67`` and ``2/3`` match ``0.6666666667``; ``3`` does
    not match ``2.5``; ``2.7779e-6`` does not match ``2.7778e-6``). An integer gold matches its exact value only.
    """
    if len(gold) > 2000 or len(prediction) > 2000 or "%" in gold or "%" in prediction:
        return None
    g, p = _number(clean(gold)), _number(clean(prediction))
    if g is None or p is None:
        return None
    if g[0] == p[0]:
        return True
    if g[1] is None and (p[1] is None or g[0].denominator == 1):
        return False
    digits = min(d for d in (g[1], p[1]) if d is not None)
    return digits >= 2 and _round_sig(g[0], digits) == _round_sig(p[0], digits)


# -- gold answers ----------------------------------------------------------------------------------------------

_UNIT_NOTE = re.compile(r"^(.*?\S)\s*\(\s*[A-Za-z][A-Za-z .'/-]{0,40}\)$")
_E_NOTATION = re.compile(r"([+-]?\d+(?:\.\d+)?)[eE]([+-]?\d+)")


def strip_unit_note(answer: str) -> str:
    """``9 (apples)`` → ``9``: a number followed by a unit in parentheses (only when what precedes is a number)."""
    match = _UNIT_NOTE.match(answer.strip())
    return match.group(1) if match and to_number(match.group(1)) is not None else answer.strip()


def latex_number(answer: str) -> str:
    """``4.5e33`` → ``4.5\\times10^{33}``: e-notation as math-verify reads it (else ``e`` is Euler's number)."""
    match = _E_NOTATION.fullmatch(answer.strip())
    return f"{match.group(1)}\\times10^{{{int(match.group(2))}}}" if match else answer


def normalize_gold(answer: str) -> str:
    """A gold answer as lanpo scores it: unicode digits and minus signs, unit notes, e-notation, no final period."""
    answer = clean(str(answer)).strip()
    answer = answer[:-1].rstrip() if answer.endswith(".") and not answer[-2:-1].isdigit() else answer
    return latex_number(strip_unit_note(answer))


# -- where a solution states its answer ------------------------------------------------------------------------

_BOX_OR_BRACE = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])[ \t]*|[{}]")
_BOX_TOKEN = re.compile(r"[^\s${},;]+")


def boxed_answers(text: str) -> list[str]:
    """Contents of every ``\\boxed{...}`` / ``\\fbox{...}`` (and ``\\boxed 5``), in order of their end; one pass."""
    return _boxes(text)[0]


def _boxes(text: str) -> tuple[list[str], bool]:
    """``(contents of closed boxes, whether a box opened after the last closed one is still open)``."""
    found: list[tuple[int, str]] = []
    stack: list[tuple[bool, int]] = []
    expect_box = -1
    for match in _BOX_OR_BRACE.finditer(text):
        token, start = match.group(0), match.start()
        if token[0] == "\\":
            end = match.end()
            if end < len(text) and text[end] == "{":
                expect_box = end
            else:
                word = _BOX_TOKEN.match(text, end)
                if word:
                    found.append((end, word.group(0).rstrip(".")))
        elif token == "{":
            stack.append((start == expect_box, start + 1))
        elif stack:
            is_box, opened = stack.pop()
            if is_box:
                found.append((start, text[opened:start].strip()))
    last_end = max((end for end, _ in found), default=-1)
    unclosed = any(is_box and opened > last_end for is_box, opened in stack)
    return [content for _, content in sorted(found)], unclosed


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``) in ``text``, braces balanced; ``None`` if absent."""
    boxes = boxed_answers(text)
    return boxes[-1] if boxes else None


def gsm8k_answer(text: str) -> str | None:
    """GSM8K rationales end in ``#### 1,234``: keep the number, without thousands separators."""
    if "####" not in text:
        return None
    answer = text.rsplit("####", 1)[1].strip()
    return answer.replace(",", "").rstrip(".") or None


_ANSWER_IS = re.compile(r"(?:final answer|answer)\s{0,8}(?:is|:|=)[ \t]{0,8}", re.IGNORECASE)
_NUMBER = re.compile(r"-?\d+(?:,\d{3})*(?:\.\d+)?(?:[eE][+-]?\d+)?(?:/\d+)?")
_WORD = re.compile(r"[A-Za-z]{2,}")
_CONNECTORS = {"or", "and"}
_SPACES = re.compile(r"[ \t]+")
_UNESCAPED_DOLLAR = re.compile(r"(?<!\\)\$")


def _stated_answer(text: str) -> str | None:
    """What follows the last "the answer is" / "answer:" up to the end of its sentence, math tokens only
    (``2^{10}``, ``5 \\times 10^{3}``, ``2 or 3``; an English word ends it: "7 because ..." → ``7``)."""
    matches = list(_ANSWER_IS.finditer(text))
    if not matches:
        return None
    rest = text[matches[-1].end():matches[-1].end() + 300].split("\n", 1)[0].strip()
    if rest.startswith("$"):
        close = _UNESCAPED_DOLLAR.search(rest, 1)
        if close:
            return rest[1:close.start()].strip() or None
    tokens = []
    for token in rest.replace("$", " ").replace("**", " ").split():
        bare = token.strip(".,;:!?()")
        if _WORD.fullmatch(bare) and bare.lower() not in _CONNECTORS:
            break
        sentence_end = token.endswith((".", "!", "?")) and not _NUMBER.fullmatch(token)
        tokens.append(token.rstrip(".!?") if sentence_end else token)
        if sentence_end:
            break
    return " ".join(tokens).strip().rstrip(".,;:!?").strip() or None


def without_copied_text(text: str, problem: str | None) -> str:
    """``text`` with every sentence of ``problem`` that contains a digit cut out (an echo of the statement)."""
    if not problem:
        return text
    squeezed = _SPACES.sub(" ", text)
    for clause in re.split(r"(?<=[.?])\s+|\n+", clean(problem)):  # not at "!": 1! + 2! is one clause
        clause = _SPACES.sub(" ", clause).strip()
        if len(clause) >= 4 and any(c.isdigit() for c in clause):
            squeezed = squeezed.replace(clause, " ")
    return squeezed


def extraction_mode(name: str) -> str:
    """The extraction mode called ``name`` (``boxed`` is the old name of ``strict``); a clear error otherwise."""
    mode = _ALIASES.get(name, name)
    if mode not in EXTRACTION_MODES:
        raise ValueError(f"Unknown extraction mode {name!r}; choose from {', '.join(EXTRACTION_MODES)}.")
    return mode


def find_answer(text: str, mode: str = "lenient", problem: str | None = None) -> tuple[str | None, str]:
    """``(answer, why_none)``: the final answer of ``text``; when ``None``, why: ``no_answer`` or ``hedged``."""
    mode = extraction_mode(mode)
    if not isinstance(text, str):
        return None, "no_answer"
    text = clean(text)
    boxes, unclosed = _boxes(text)
    boxes = [b for b in boxes if b]
    if unclosed:  # cut off while writing its answer (\boxed{12 on the way to 123): no answer
        return None, "no_answer"
    if boxes:
        if len({_value_key(b) for b in boxes}) > 1:
            return None, "hedged"
        return boxes[-1], ""
    if mode == "strict":
        return None, "no_answer"
    text = without_copied_text(text, problem)
    if "####" in text:  # GSM8K style: the answer line beats any "the answer is" before it
        tail = text.rsplit("####", 1)[1].strip().split("\n")[0].strip()
        if tail:
            return tail, ""
    stated = _stated_answer(text)
    if stated:
        return stated, ""
    numbers = _NUMBER.findall(text)
    return (numbers[-1], "") if numbers else (None, "no_answer")


def extract_answer(text: str, mode: str = "lenient", problem: str | None = None) -> str | None:
    """The final answer written in ``text`` (see the module docstring for the modes), or ``None``."""
    return find_answer(text, mode, problem)[0]


# -- hedges ----------------------------------------------------------------------------------------------------

_SEPARATORS = re.compile(r"\\text\{\s*(?:or|and)\s*\}|\\(?:lor|vee|quad|qquad)(?![A-Za-z])|\bor\b|\band\b|[,;=]")
_LABEL = re.compile(r"(?:[A-Za-z]|\\(?:alpha|beta|gamma|delta|theta|phi|varphi|lambda|mu|omega|sigma|rho|tau|psi"
                    r"|chi|eta|zeta|xi|nu|kappa|epsilon|varepsilon))(?:_\{?\w+\}?)?")
_CHOICE = re.compile(r"\(?[A-Za-z]\)?")


def _value_key(part: str) -> str:
    number = to_number(part)
    return f"#{number}" if number is not None else re.sub(r"\s+|\\text\{|\}|\{", "", part).strip("()").lower()


def split_values(answer: str) -> list[str]:
    """The parts of an answer at top level (outside braces and brackets) separated by ``,`` ``;`` ``=`` "or"
    "and" ``\\lor``: ``x = 5`` → ``[x, 5]``; ``(1, 2)`` stays whole."""
    parts, depth, start = [], 0, 0
    for match in re.finditer(r"[{}()\[\]]|" + _SEPARATORS.pattern, answer):
        token = match.group(0)
        if token in "{([":
            depth += 1
        elif token in "})]":
            depth = max(0, depth - 1)
        elif depth == 0:
            parts.append(answer[start:match.start()])
            start = match.end()
    parts.append(answer[start:])
    return [p.strip() for p in parts if p.strip()]


def names_several_values(prediction: str, gold: str) -> bool:
    """Whether ``prediction`` names more distinct values than ``gold`` does (a hedge: ``2 \\text{ or } 3``,
    ``w = g``, ``x=6 = x=5`` for one value; ``\\pm`` where the gold has none).

    Labels (``x`` in ``x = 5``) are not values, except where the gold is itself a letter (a choice).
    """
    if to_number(prediction) is not None:  # one plain number, "1,234" included
        return False
    plus_minus = re.compile(r"\\[mp]m(?![A-Za-z])")
    if plus_minus.search(prediction) and not plus_minus.search(gold):
        return True
    gold_parts = split_values(gold)
    bare = re.sub(r"\\text\{\s*(.*?)\s*\}", r"\1", gold_parts[0]).strip() if len(gold_parts) == 1 else ""
    choice = bool(_CHOICE.fullmatch(bare))

    def values(parts: list[str]) -> list[str]:
        return [_value_key(p) for p in parts if choice or not _LABEL.fullmatch(p)]

    gold_values, predicted = values(gold_parts), values(split_values(prediction))
    if len(set(gold_values)) <= 1:  # one value: restating it is fine (1/2 = 0.5), a second one is a hedge
        return len(set(predicted)) > 1
    return len(predicted) > len(gold_values)  # a list: no more items than the gold has
