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

In both modes a completion that boxes several different values has no answer (a hedge), unless the gold names
several values and the boxes state exactly as many (:func:`boxes_as_list`: ``\\boxed{2}`` and ``\\boxed{3}`` for
``2, 3``). :func:`stated_value` reads a chain of equalities (``x = 5 + 5 + 1 = 11`` states 11; ``= 7 = 11`` is a
hedge), and :func:`names_several_values` rejects a final answer that names more distinct values than the gold
(``2 \\text{ or } 3``, ``w = g``, ``a \\lor b`` where the gold is one value).
"""

from __future__ import annotations

import logging
import re
from typing import NamedTuple

from lanpo.verify.numerals import clean, evaluate, numbers_match, to_number, word_number, written_numbers

logger = logging.getLogger(__name__)

EXTRACTION_MODES = ("strict", "lenient")
_ALIASES = {"boxed": "strict"}  # the name of `strict` before 0.2

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
    return [box.content for box in _boxes(text)[0]]


class _Box(NamedTuple):
    """One box of a text: where it starts (its ``\\boxed``) and ends (after its closing brace), and what it holds."""

    start: int
    end: int
    content: str


def _boxes(text: str) -> tuple[list[_Box], bool]:
    """``(closed boxes in order of their end, whether a box opened after the last closed one is still open)``."""
    found: list[_Box] = []
    stack: list[tuple[int, int]] = []  # per open brace: where its box starts (-1: not a box's brace), content start
    expect_box, box_start = -1, -1
    for match in _BOX_OR_BRACE.finditer(text):
        token = match.group(0)
        start = match.start()
        if token[0] == "\\":
            end = match.end()
            if end < len(text) and text[end] == "{":
                expect_box, box_start = end, start
            else:
                word = _BOX_TOKEN.match(text, end)
                if word:
                    found.append(_Box(start, word.end(), word.group(0).rstrip(".")))
        elif token == "{":
            stack.append((box_start if start == expect_box else -1, start + 1))
        elif stack:
            opened_at, opened = stack.pop()
            if opened_at >= 0:
                found.append(_Box(opened_at, start + 1, text[opened:start].strip()))
    found.sort(key=lambda box: box.end)
    last_end = max((box.end - 1 for box in found), default=-1)
    unclosed = any(opened_at >= 0 and opened > last_end for opened_at, opened in stack)
    return found, unclosed


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
_NUMBER = re.compile(r"-?(?:[1-9]\d{0,2}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][+-]?\d+)?(?:/\d+)?")
# Math delimiters (\\( \\) \\[ \\]) first, so they are not read as brackets; then brackets; then numbers.
_NUMBER_OR_BRACKET = re.compile(r"\\[()\[\]]|[(){}\[\]]|" + _NUMBER.pattern)
_OPERATOR_BEFORE = set("^_/*+-")
_OPERATOR_AFTER = set("^_/*+-!")
_OPERAND_COMMAND = re.compile(
    r"\\(?:sqrt|[dt]?frac|times|cdot|div|pm|mp|log|ln|lg|exp|sin|cos|tan|sec|csc|cot|binom|"
    r"sum|prod|b?mod|pmod)\s*$"
)
_PRODUCT_AFTER = re.compile(r"\\(?:times|cdot|div)(?![A-Za-z])")
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
    rest = text[matches[-1].end() : matches[-1].end() + 300].split("\n", 1)[0].strip()
    if rest.startswith("$"):
        close = _UNESCAPED_DOLLAR.search(rest, 1)
        if close:
            return rest[1 : close.start()].strip() or None
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
    """``(answer, why_none)``: the final answer of ``text``; when ``None``, why: ``no_answer``, ``hedged``, or
    ``unreadable`` where a bug of these readers raised on the text (logged once per kind of error with the text:
    model output is read mid-run, by the reward, the teacher and the pool, and a reader's bug must cost one
    answer, never the run)."""
    mode = extraction_mode(mode)
    try:
        return _find_answer(text, mode, problem)
    except Exception as error:  # noqa: BLE001 - any reader bug; the tests assert it never happens
        kind = type(error).__name__
        if kind not in _UNREADABLE_SEEN:
            _UNREADABLE_SEEN.add(kind)
            logger.warning("the answer reader failed (%s: %s) on %r: read as no answer", kind, error, str(text)[:300])
        return None, "unreadable"


_UNREADABLE_SEEN: set[str] = set()  # the kinds of reader error already logged in this process


def _find_answer(text: str, mode: str, problem: str | None) -> tuple[str | None, str]:
    if not isinstance(text, str):
        return None, "no_answer"
    text = clean(text)
    found, unclosed = _boxes(text)
    boxes = [box.content for box in found if box.content]
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
    number = last_standalone_number(text)
    return (number, "") if number else (None, "no_answer")


def last_standalone_number(text: str) -> str | None:
    """The last number of ``text`` that stands alone: outside every bracket and brace, not glued to a word
    before it (``x2``), and with no operator or operator command beside it. Never a piece of an expression: not
    the 9 of ``\\frac{10}{9}``, the 1 of ``(9+1)``, the 10 of ``2^{10}`` or the 5 of ``\\sqrt5``. One pass."""
    depth = 0
    last = None
    for match in _NUMBER_OR_BRACKET.finditer(text):
        token = match.group(0)
        if token[0] == "\\":  # \( \) \[ \]: math delimiters
            continue
        if token in "({[":
            depth += 1
        elif token in ")}]":
            depth = max(0, depth - 1)
        elif depth == 0 and _stands_alone(text, match.start(), match.end()):
            last = token
    return last


def _stands_alone(text: str, start: int, end: int) -> bool:
    if start > 0 and (text[start - 1].isalpha() or text[start - 1] == "\\"):
        return False
    before = text[max(0, start - 40) : start].rstrip()
    if before and (before[-1] in _OPERATOR_BEFORE or _OPERAND_COMMAND.search(before)):
        return False
    if text[start] == "-" and before and (before[-1].isalnum() or before[-1] in ")}]"):
        return False  # 5-3: a difference, not -3
    after = text[end : end + 40].lstrip()
    return not (after and (after[0] in _OPERATOR_AFTER or _PRODUCT_AFTER.match(after)))


def extract_answer(text: str, mode: str = "lenient", problem: str | None = None) -> str | None:
    """The final answer written in ``text`` (see the module docstring for the modes), or ``None``."""
    return find_answer(text, mode, problem)[0]


# -- hedges ----------------------------------------------------------------------------------------------------

_SEPARATORS = re.compile(r"\\text\{\s*(?:or|and)\s*\}|\\(?:lor|vee|quad|qquad)(?![A-Za-z])|\bor\b|\band\b|[,;=]")
_LABEL = re.compile(
    r"(?:[A-Za-z]|\\(?:alpha|beta|gamma|delta|theta|phi|varphi|lambda|mu|omega|sigma|rho|tau|psi"
    r"|chi|eta|zeta|xi|nu|kappa|epsilon|varepsilon))(?:_\{?\w+\}?)?"
)
_CHOICE = re.compile(r"\(?[A-Za-z]\)?")


def _value_key(part: str) -> str:
    number = to_number(part)
    return f"#{number}" if number is not None else re.sub(r"\s+|\\text\{|\}|\{", "", part).strip("()").lower()


def split_values(answer: str, separators: re.Pattern = _SEPARATORS) -> list[str]:
    """The parts of an answer at top level (outside braces and brackets) separated by ``,`` ``;`` ``=`` "or"
    "and" ``\\lor`` (or by ``separators``): ``x = 5`` → ``[x, 5]``; ``(1, 2)`` stays whole."""
    parts = []
    depth = 0
    start = 0
    for match in re.finditer(r"[{}()\[\]]|" + separators.pattern, answer):
        token = match.group(0)
        if token in "{([":
            depth += 1
        elif token in "})]":
            depth = max(0, depth - 1)
        elif depth == 0:
            parts.append(answer[start : match.start()])
            start = match.end()
    parts.append(answer[start:])
    return [p.strip() for p in parts if p.strip()]


_EQUALS = re.compile(r"(?<![<>!\\])=")
_LIST = re.compile(r"\\text\{\s*(?:and)\s*\}|\band\b|[,;]")
_SUBSCRIPT = re.compile(r"_(?:\{[^{}]*\}|\\?\w)")
_ARGUMENTS = re.compile(r"(?<=[A-Za-z}])\s*\([^()]*\)")  # f(2), P(A \cap B), \overline{AB}(3)
_COMMAND = re.compile(r"\\[A-Za-z]+")
_SPACING = re.compile(r"\\[,!;: ]")
# Greek letters that name quantities (``\alpha = 30``); not \pi, which is a value
_GREEK = re.compile(
    r"\\(?:alpha|beta|gamma|delta|theta|phi|varphi|lambda|mu|omega|sigma|rho|tau|psi|chi|eta|zeta|xi|nu|kappa"
    r"|epsilon|varepsilon)(?![A-Za-z])"
)


def is_label(part: str) -> bool:
    """Whether ``part`` names a quantity rather than states a value: letters, a tuple of letters, a segment or
    an angle (``AB``, ``\\angle ABC``), a function of its arguments (``f(2)``, ``P(A)``), subscripts and all
    (``S_{10}``, ``a_1 + a_2``): no number outside subscripts and arguments, and at least one letter."""
    bare = _COMMAND.sub(" ", _GREEK.sub("g", _ARGUMENTS.sub(" ", _SUBSCRIPT.sub(" ", part))))
    return not any(c.isdigit() for c in bare) and any(c.isalpha() for c in bare)


def _same_value(a: str, b: str) -> bool:
    """Whether two steps of a chain state the same value: by lanpo's number policy, by exact arithmetic
    (``5+5+1`` and ``11``), else written alike."""
    for first, second in ((a, b), (b, a)):
        if numbers_match(first, second):
            return True
    x, y = evaluate(a), evaluate(b)
    if x is not None and y is not None:
        return x == y
    return _value_key(a) == _value_key(b)


def _is_choice(gold: str) -> bool:
    parts = split_values(gold)
    bare = re.sub(r"\\text\{\s*(.*?)\s*\}", r"\1", parts[0]).strip() if len(parts) == 1 else ""
    return bool(_CHOICE.fullmatch(bare))


def _labels_are_values(gold: str) -> bool:
    """Where the gold is a letter (a choice) or itself has a label's shape (``n``, ``f(4 - x)``), a label-shaped
    part of a prediction may be the answer or a second one: it counts as a value."""
    return _is_choice(gold) or is_label(gold)


def stated_value(prediction: str, gold: str) -> str | None:
    """The value a final answer states, given the gold's shape; ``None`` when it states several (a hedge).

    * A chain ``L = v1 = ... = vn`` states ``vn`` when its leading parts are labels (:func:`is_label`:
      ``(x, y) = (5, 8)``, ``AB = 5``, ``f(2) = 5``, ``\\angle ABC = 30^\\circ``) and every other step states the
      same value as ``vn`` (``x = 5 + 5 + 1 = 11``, ``\\frac{1}{2} = 0.5``); a step that disagrees (``7 = 11``)
      makes the chain a hedge. Where the gold is itself an equation, a letter (a choice) or label-shaped
      (``f(4 - x)``: then labels are values), the prediction is left whole.
    * A list that repeats one value (``2, 2``) states that value where the gold is one value.
    """
    prediction = prediction.strip()
    choice = _labels_are_values(gold)
    gold_items = split_values(gold, _LIST)
    if len(gold_items) > 1 and not choice and not _EQUALS.search(gold):  # a list gold, written without labels
        items = split_values(_SPACING.sub(" ", prediction), _LIST)
        if len(items) > 1 and any(_EQUALS.search(item) for item in items):  # a labelled list: a = 4, -8, -10
            values = [stated_value(item, gold_items[0]) for item in items]  # each item one value, chains checked
            return None if None in values else ", ".join(values)
    parts = split_values(prediction, _EQUALS)
    if len(parts) > 1 and len(split_values(gold, _EQUALS)) == 1 and not choice:
        start = 0
        while start < len(parts) - 1 and is_label(parts[start]):
            start += 1
        steps = parts[start:]
        if any(not _same_value(step, steps[-1]) for step in steps[:-1]):
            return None
        prediction = steps[-1]
    if len(split_values(gold)) == 1 and not choice:
        items = split_values(prediction, _LIST)
        if len(items) > 1 and len({_value_key(item) for item in items}) == 1:
            return items[0]
    return prediction


_GOLD_LIST = re.compile(r"\\text\{\s*(?:and|or)\s*\}|\band\b|\bor\b|[,;]")
_DELIMITERS = (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]"))
_QUAD = re.compile(r"\\q?quad")  # glued to what follows too: ``,\quadx_{2}``
_SET_BRACES = (("\\{", "\\}"), ("{", "}"), ("\\left\\{", "\\right\\}"))
_SEPARATOR_WORD = re.compile(r"\b(?:and|or)\b|[,;]|\\q?quad")  # what joins the boxes of one list answer
_TEXT_COMMAND = re.compile(r"\\(?:text|mathrm|q?quad)")
_PLUS_MINUS = re.compile(r"\\pm(?![A-Za-z])")


def _boxes_list(text: str, boxes: list[_Box]) -> bool:
    r"""Whether several boxes of ``text`` are one list answer: nothing but separators stands between them
    (``\boxed{1}, \boxed{2}``, ``\boxed{a} \quad \text{and} \quad \boxed{b}``); prose between them
    (``\boxed{1} no no \boxed{2}``) makes the last box the answer, as Math-Verify reads it. The gaps are read by
    position, so a box's content written elsewhere in the text (or an empty box) cannot move them."""
    between = [_BOX_OR_BRACE.sub(" ", text[left.end : right.start]) for left, right in zip(boxes, boxes[1:])]
    # each gap a separator (units beside it allowed: "\boxed{1} papers and \boxed{2}"), or no words at all
    return all(
        _SEPARATOR_WORD.search(gap) or not re.search(r"[A-Za-z]{2,}", _TEXT_COMMAND.sub("", gap)) for gap in between
    )


def _stated_boxes(text: str) -> tuple[str, bool]:
    """``(what the boxes of text state, whether several boxes make one list)``: their contents joined when they
    are one list, else the last box; text without a box as it is. An empty box states nothing (as in
    :func:`find_answer`)."""
    boxes = [box for box in _boxes(text)[0] if box.content]
    if len(boxes) > 1 and _boxes_list(text, boxes):
        return ", ".join(box.content for box in boxes), True
    return (boxes[-1].content if boxes else text), False


def _unwrap(text: str) -> str:
    """An answer without its math delimiters and set braces: ``$${1,2,3}$$`` → ``1,2,3``."""
    text = text.strip()
    for start, end in _DELIMITERS:
        if text.startswith(start) and text.endswith(end) and len(text) > len(start) + len(end):
            text = text[len(start) : -len(end)].strip()
    for start, end in _SET_BRACES:
        inner = text[len(start) : -len(end)] if text.startswith(start) and text.endswith(end) else None
        if inner and split_values(inner, _GOLD_LIST) != [inner.strip()] and "{" not in inner.replace("\\{", ""):
            return inner.strip()
    return text


def _label_name(label: str) -> str:
    """A label without its index: ``x_{1}`` and ``x_2`` both name ``x`` (roots of one equation: a list)."""
    return _SUBSCRIPT.sub("", re.sub(r"\s+", "", label))


def _list_items(answer: str) -> tuple[list[str], list[str], bool] | None:
    """``(values, labels, rich)`` of an answer that lists values: its boxes when they are one list (else its last
    box), delimiters and set braces off, split at commas, "and", "or" and semicolons, each item ``value`` or
    ``label = value``; ``rich`` when the list was written with boxes, words or semicolons. None where an item is
    an equation or a chain."""
    text, several = _stated_boxes(answer.strip())
    text = _QUAD.sub(" ", _SPACING.sub(" ", _unwrap(text)))
    items = [item.strip().strip("$").strip() for item in split_values(text, _GOLD_LIST)]
    items = [item for item in items if item]
    rich = several or bool(re.search(r"\\text\{\s*(?:and|or)\s*\}|\b(?:and|or)\b|;", text))
    values, labels = [], []
    for item in items:
        parts = split_values(item, _EQUALS)
        if len(parts) == 2 and is_label(parts[0]):
            values.append(parts[1])
            labels.append(_label_name(parts[0]))
        elif len(parts) == 1:
            values.append(parts[0])
        else:
            return None
    return values, labels, rich


def gold_as_list(gold: str) -> str | None:
    """A gold answer that lists several values in a rich form, as the plain list ``v1, v2, ...``: several boxes
    with only separators between them (``\\boxed{1}\\boxed{2}``; prose between boxes makes the last box the gold),
    values joined by "and" or "or" (``\\boxed{6 \\text{ and } 8}``, ``$21,16$ or $11$``), or
    under one label, indices aside (``\\boxed{a=4,\\,-8,\\,-10}``, ``p = -1 \\text{ and } p = \\frac{15}{8}``,
    ``x_1 = 2, x_2 = 3``). None for every other gold (one value, a plain list, a tuple, an interval, an equation,
    and values under different labels, which say which value is which: :func:`labelled_values`).

    :func:`read_alike` applies the same rule to a prediction: a list answer reads alike on either side."""
    found = _list_items(gold)
    if found is None:
        return None
    values, labels, rich = found
    if len(set(labels)) > 1:
        return None  # x = 2, y = 3 names which value is which: never a set
    return ", ".join(values) if len(values) > 1 and (rich or labels) else None


def labelled_values(answer: str) -> list[str] | None:
    """The values of an answer that names each under a label of its own (``x = -5, p = \\frac{14}{3}``), in order;
    None for any other answer."""
    found = _list_items(answer)
    if found is None:
        return None
    values, labels, _ = found
    if len(values) > 1 and len(labels) == len(values) and len(set(labels)) == len(labels):
        return values
    return None


def gold_answer(gold: str) -> str:
    """The gold as lanpo compares it: normalized, a list answer as its plain list, a worked solution with boxes as
    its answer box (the last one, or the boxes of one list)."""
    gold = normalize_gold(gold)
    listed = gold_as_list(gold)
    if listed:
        return listed
    stated, several = _stated_boxes(gold)
    return gold if several else stated  # several boxes that gold_as_list could not list: compared as written


def boxes_as_list(text: str, gold: str) -> str | None:
    """Where the gold names several values (``2, 3``) and a completion boxes each of them once (``\\boxed{2}``
    and ``\\boxed{3}``): the boxes as one list answer. ``None`` when the gold is one value or the number of
    distinct boxes differs from the number of the gold's values, or a box states more than one value (then
    several boxes stay a hedge)."""
    gold = _unwrap(gold_answer(gold))  # a set gold ({1,2,3}) lists its values too
    gold_values = {_value_key(p) for p in split_values(gold) if not is_label(p)}
    if len(gold_values) < 2:
        return None
    boxes = []
    seen = set()
    for box in boxed_answers(clean(text)):
        parts = split_values(box, _EQUALS) if box else []
        if len(parts) == 2 and is_label(parts[0]):  # \boxed{k = 45}: the value under its label
            box = parts[1]
        value = stated_value(box, gold) if box else None
        if value is None or len(split_values(value)) != 1:  # each box states one value
            return None
        if _value_key(value) not in seen:
            seen.add(_value_key(value))
            boxes.append(value)
    return ", ".join(boxes) if len(boxes) == len(gold_values) else None


def names_several_values(prediction: str, gold: str) -> bool:
    """Whether ``prediction`` names more distinct values than ``gold`` does (a hedge: ``2 \\text{ or } 3``,
    ``w = g``, ``x=6 = x=5`` for one value; ``\\pm`` where the gold has none). Repeats count once.

    Labels (``x`` in ``x = 5``) are not values, except where the gold is itself a letter (a choice).
    """
    if to_number(prediction) is not None:  # one plain number, "1,234" included
        return False
    gold, prediction = _unwrap(gold), _unwrap(prediction)  # a set ({1,2,3}) names its values, on either side
    plus_minus = re.compile(r"\\[mp]m(?![A-Za-z])")
    if plus_minus.search(prediction) and not plus_minus.search(gold):
        return True
    choice = _is_choice(gold)

    def values(parts: list[str]) -> set[str]:
        return {_value_key(p) for p in parts if choice or not _LABEL.fullmatch(p)}

    gold_values, predicted = values(split_values(gold)), values(split_values(prediction))
    return len(predicted) > max(1, len(gold_values))


# -- whether a text states an answer (for scrubbing lessons of their source problem's answer) ------------------


def mentions_answer(text: str, answer: str) -> bool:
    """Whether ``text`` states ``answer`` in any equivalent form: ``7`` as ``14/2``, ``7.0``, ``seven``, ``７``,
    ``\\frac{14}{2}``; ``1000`` as ``1 000`` or ``10^3``; ``0.5`` as ``.5`` or ``one half``; ``-3`` with U+2212.
    A non-numeric answer is matched as written (spacing, braces and ``\\text`` aside); a one-letter answer (a
    choice) only as a choice: ``(B)``, ``option B``, ``answer B``."""
    answer = normalize_gold(answer)
    if not answer:
        return False
    if to_number(answer) is not None:
        for span in written_numbers(text):
            negative = span.startswith("-") and span[1:2].isalpha()  # "negative three"
            word = span[1:] if negative else span
            word_value = word_number(word) if word[:1].isalpha() else None
            if word_value is not None and negative:
                word_value = -word_value
            if numbers_match(answer, span) or (word_value is not None and word_value == to_number(answer)):
                return True
        return False
    bare = re.sub(r"\\text\{\s*(.*?)\s*\}", r"\1", answer).strip("() ")
    if re.fullmatch(r"[A-Za-z]", bare):
        return bool(re.search(rf"\(\s*{bare}\s*\)|\b(?:option|choice|answer)\s*(?:is\s*)?:?\s*\(?{bare}\b", text))
    squash = lambda s: re.sub(r"\\text|\\mathrm|\\left|\\right|[\s{}$]|\\[,!;: ]", "", clean(s))  # noqa: E731
    key = squash(answer)
    if not key:
        return False
    if key.isalpha():
        return bool(re.search(rf"\b{re.escape(key)}\b", squash_words(text), re.IGNORECASE))
    return key in squash(text)


def squash_words(text: str) -> str:
    return re.sub(r"\\text\{\s*(.*?)\s*\}", r"\1", clean(text))


# -- intervals and inequalities --------------------------------------------------------------------------------

_RELATION = re.compile(r"\\leqslant|\\geqslant|\\leq?(?![A-Za-z])|\\geq?(?![A-Za-z])|\\lt|\\gt|<=|>=|<|>")
_VARIABLE = re.compile(r"[A-Za-z](?:_\{?\w{1,8}\}?)?")
_IN = re.compile(r"([A-Za-z](?:_\{?\w{1,8}\}?)?)[ \t]{0,8}\\in(?![A-Za-z])")
_INTERVAL = re.compile(r"[\[(][^\[\]()]*,[^\[\]()]*[\])]")


def _closed(relation: str) -> bool:
    return "=" in relation or relation.startswith(("\\le", "\\ge"))


def _less(relation: str) -> bool:
    return relation.startswith(("<", "\\le", "\\lt"))


def as_interval(answer: str) -> str | None:
    """A one-variable inequality as the interval it describes (``-2 \\le x \\le 7`` → ``[-2, 7]``, ``x > 3`` →
    ``(3, \\infty)``), and ``x \\in [a, b]`` as ``[a, b]``; None for anything else. Linear in the answer's length
    (it runs in the trainer's process)."""
    text = answer.strip().strip("$").strip()
    inside = _IN.match(text)
    if inside is not None:
        return text[inside.end() :].strip() or None
    relations = list(_RELATION.finditer(text))
    if len(relations) == 2 and all(_less(r.group(0)) for r in relations):
        first, second = relations
        low, variable, high = (
            text[: first.start()].strip(),
            text[first.end() : second.start()].strip(),
            text[second.end() :].strip(),
        )
        if low and high and _VARIABLE.fullmatch(variable):
            return f"{'[' if _closed(first.group(0)) else '('}{low}, {high}{']' if _closed(second.group(0)) else ')'}"
    if len(relations) == 1:
        relation = relations[0].group(0)
        variable, bound = text[: relations[0].start()].strip(), text[relations[0].end() :].strip()
        if bound and _VARIABLE.fullmatch(variable):
            if _less(relation):
                return f"(-\\infty, {bound}{']' if _closed(relation) else ')'}"
            return f"{'[' if _closed(relation) else '('}{bound}, \\infty)"
    return None


def _both_values(answer: str) -> str | None:
    """``a \\pm b`` as its two values ``a + b, a - b`` (``\\pm b``: ``b, -b``); None unless the answer is one such
    value."""
    plain = answer.strip().strip("$").strip()
    if len(_PLUS_MINUS.findall(plain)) != 1 or split_values(plain, _GOLD_LIST)[1:] or plain[:1] in "{(":
        return None
    head, tail = (part.strip() for part in _PLUS_MINUS.split(plain))
    return f"{head} + {tail}, {head} - {tail}" if head else f"{tail}, -{tail}"


def read_alike(gold: str, prediction: str) -> tuple[str, str | None]:
    """The gold (as :func:`gold_answer` gives it) and a prediction brought to one form by the same rules, whichever
    side wrote which: a list answer as its plain list, labels on either side (a gold that names each value under
    its own label against the values unlabelled: both as tuples, in order), ``a \\pm b`` against its two values,
    an inequality against its interval. The prediction is None where it hedges (:func:`stated_value`)."""
    prediction = gold_as_list(prediction) or prediction
    in_order = labelled_values(gold)
    if in_order and not _EQUALS.search(prediction):  # x = -5, p = 14/3 against -5, 14/3: the values in order
        gold = "(" + ", ".join(in_order) + ")"  # a tuple: the order says which value is which
        plain = prediction.strip().strip("$").strip()
        prediction = plain if plain.startswith("(") and plain.endswith(")") else f"({plain})"
    stated = stated_value(prediction, gold)
    if stated is None:
        return gold, None
    gold_pm, pred_pm = _both_values(gold), _both_values(stated)
    if gold_pm and not _PLUS_MINUS.search(stated):
        gold = gold_pm
    elif pred_pm and not _PLUS_MINUS.search(gold):
        stated = pred_pm
    return same_form(gold, stated)


def same_form(gold: str, prediction: str) -> tuple[str, str]:
    """An inequality on one side and an interval (or ``x \\in`` an interval) on the other: both as intervals, so
    the rule reads alike whichever side wrote which. Anything else is returned as it was."""
    gold_interval, pred_interval = as_interval(gold), as_interval(prediction)
    gold_plain, pred_plain = gold.strip().strip("$").strip(), prediction.strip().strip("$").strip()
    if gold_interval and (pred_interval or _INTERVAL.fullmatch(pred_plain)):
        return gold_interval, pred_interval or pred_plain
    if pred_interval and _INTERVAL.fullmatch(gold_plain):
        return gold_plain, pred_interval
    return gold, prediction
