"""Numbers as people and models write them: ``7``, ``1,234``, ``1 000``, ``4.5e33``, ``4.5 \\times 10^{33}``,
``14/2``, nested ``\\frac``, ``2^{10}``, ``seven``, ``７``, ``−3``. Exact values (``Fraction``), a tolerance policy for
rounded decimals, and every number a text writes. All in time linear in the input.
"""

from __future__ import annotations

import re
import unicodedata
from decimal import Decimal, localcontext
from fractions import Fraction

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
    """Unicode digits (``７``), minus signs (U+2212) and ``×`` in ASCII/LaTeX form, NUL bytes removed,
    brace-less fractions braced (``\\frac\\pi 2`` → ``\\frac{\\pi}{2}``: math-verify misreads the bare form), and
    thousands written with LaTeX separators ungrouped (:func:`ungroup`)."""
    return ungroup(_BARE_FRAC.sub(r"\\\1{\2}{\3}", text.translate(_TABLE)))


# A thousands separator: a comma (``1,234``; ``{,}``; followed by LaTeX spacing ``,\!`` ``,\,`` and spaces after
# it) or LaTeX spacing alone (``32\,349``). A comma followed by a plain space is a list (``1, 234``).
_GROUP_SEPARATOR = r"(?:,(?:\\[!,;: ]\s*)*|\{,\}|(?:\\[!,;: ]\s*)+)"
_GROUPED = re.compile(r"(?<![\d.])([1-9]\d{0,2})((?:" + _GROUP_SEPARATOR + r"\d{3})+)(?!\d|,\d|\{,\})")
_NOT_DIGIT = re.compile(r"\D")
_PLAIN_COMMAS = re.compile(r"(?:,\d{3})+")


def ungroup(text: str) -> str:
    """``32,\\! 349`` → ``32349``, ``1{,}000`` → ``1000``, ``1,234,567`` → ``1234567``. A comma or LaTeX space
    separates thousands only when every group after it has exactly three digits and the first group does not
    start with 0: ``0,500`` and ``1,2345`` stay as written (lists, or not numbers); so does a plain comma next to
    a bracket, ``(12,102)`` (a point or an interval)."""
    if "," not in text and "\\" not in text:
        return text

    def digits(match: re.Match) -> str:
        plain = _PLAIN_COMMAS.fullmatch(match.group(2))
        before = text[: match.start()].rstrip()[-1:]
        after = text[match.end() :].lstrip()[:1]
        if plain and (before in ("(", "[") or after in (")", "]")):
            return match.group(0)  # (12,102): a point or an interval, not twelve thousand
        return match.group(1) + _NOT_DIGIT.sub("", match.group(2))

    return _GROUPED.sub(digits, text)


_THOUSANDS = re.compile(r"-?[1-9]\d{0,2}(,\d{3})+(\.\d+)?")


def strip_thousands(text: str) -> str:
    """``1,234,567.5`` → ``1234567.5``; anything that is not such a number comes back unchanged."""
    return text.replace(",", "") if _THOUSANDS.fullmatch(text) else text


# -- numbers ---------------------------------------------------------------------------------------------------

_DECIMAL = re.compile(
    r"([+-]?)([1-9]\d{0,2}(?:,\d{3})+|[1-9]\d{0,2}(?: \d{3})+|\d+)?(?:\.(\d+))?"
    r"(?:[eE]([+-]?\d{1,4}))?"
)
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
        if text[power.end() :].strip():
            return None
        exponent = int(power.group(1) or power.group(2))
        text = text[: power.start()].strip() or "1"
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
            end = _braced(body, first)
            middle = end
            while 0 <= middle < len(body) and body[middle] == " ":  # \frac{1} {2}
                middle += 1
            if end < 0 or middle >= len(body) or body[middle] != "{" or _braced(body, middle) != len(body):
                return None
            top, bottom = _number(body[first + 1 : end - 1], depth + 1), _number(body[middle + 1 : -1], depth + 1)
            if top is None or bottom is None or bottom[0] == 0:
                return None
            return sign * top[0] / bottom[0], None
    power = _INT_POWER.fullmatch(text.removeprefix("-"))
    if power:  # 2^{98}: exact, so 1/2^98 and 2/2^98 never look equal (math-verify rounds to 6 places); -10^1 = -10
        base = _decimal(power.group(1))
        exponent = int(power.group(2) or power.group(3))
        if (
            base is None
            or base[1] is not None
            or abs(exponent) * len(power.group(1)) > 4 * MAX_EXPONENT
            or (base[0] == 0 and exponent < 0)
        ):
            return None
        return (-1 if text.startswith("-") else 1) * base[0] ** exponent, None
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


# -- simple arithmetic, exactly ------------------------------------------------------------------------------

_FRAC_GROUPS = re.compile(r"\\[dt]?frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}")
_ARITH_TOKEN = re.compile(r"\s*(\d+(?:\.\d+)?|\.\d+|[-+*/^()])")
MAX_ARITH_CHARS = 200


def evaluate(text: str) -> Fraction | None:
    """The exact value of simple arithmetic: numbers, ``+ - * / ^`` (integer powers up to 64), ``\\times``,
    ``\\cdot``, ``\\div``, parentheses and ``\\frac`` of such (``5+5+1`` → 11, ``\\frac{3}{4} \\cdot 8`` → 6);
    ``None`` for anything else (a letter, a root, a function). Linear in the input; inputs over 200 characters are
    not evaluated."""
    if not isinstance(text, str) or len(text) > MAX_ARITH_CHARS or "%" in text:
        return None
    value = to_number(text)
    if value is not None:
        return value
    expression = _strip(clean(text))
    for old, new in (("\\times", "*"), ("\\cdot", "*"), ("\\div", "/"), ("\\left", ""), ("\\right", "")):
        expression = expression.replace(old, new)
    for _ in range(8):  # innermost fractions first
        expression, count = _FRAC_GROUPS.subn(r"((\1)/(\2))", expression)
        if not count:
            break
    expression = expression.replace("{", "(").replace("}", ")")
    tokens = []
    position = 0
    while position < len(expression):
        match = _ARITH_TOKEN.match(expression, position)
        if not match:
            if expression[position:].strip():
                return None
            break
        tokens.append(match.group(1))
        position = match.end()
    try:
        value, rest = _sum(tokens, 0)
    except (ValueError, ZeroDivisionError, IndexError, OverflowError, RecursionError):
        return None
    return value if rest == len(tokens) else None


def _sum(tokens: list[str], i: int) -> tuple[Fraction, int]:
    value, i = _product(tokens, i)
    while i < len(tokens) and tokens[i] in "+-":
        right, j = _product(tokens, i + 1)
        value, i = (value + right if tokens[i] == "+" else value - right), j
    return value, i


def _product(tokens: list[str], i: int) -> tuple[Fraction, int]:
    value, i = _signed(tokens, i)
    while i < len(tokens) and tokens[i] in "*/":
        right, j = _signed(tokens, i + 1)
        value, i = (value * right if tokens[i] == "*" else value / right), j
    return value, i


def _signed(tokens: list[str], i: int, depth: int = 0) -> tuple[Fraction, int]:
    if depth > MAX_DEPTH:
        raise ValueError("too deep")
    if tokens[i] in "+-":
        value, j = _signed(tokens, i + 1, depth + 1)
        return (-value if tokens[i] == "-" else value), j
    base, i = _atom(tokens, i, depth)
    if i < len(tokens) and tokens[i] == "^":
        exponent, i = _signed(tokens, i + 1, depth + 1)
        if exponent.denominator != 1 or abs(exponent) > 64 or (base == 0 and exponent < 0):
            raise ValueError("not a small integer power")
        base = base ** int(exponent)
    return base, i


def _atom(tokens: list[str], i: int, depth: int) -> tuple[Fraction, int]:
    if tokens[i] == "(":
        if depth > MAX_DEPTH:
            raise ValueError("too deep")
        value, i = _sum(tokens, i + 1) if depth < MAX_DEPTH else (Fraction(0), i)
        if i >= len(tokens) or tokens[i] != ")":
            raise ValueError("unbalanced")
        return value, i + 1
    if tokens[i] in "+-*/^)":
        raise ValueError("operator where a number goes")
    return Fraction(tokens[i]), i + 1


# -- every number a text writes ---------------------------------------------------------------------------------

_UNITS = [
    "zero",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "eleven",
    "twelve",
    "thirteen",
    "fourteen",
    "fifteen",
    "sixteen",
    "seventeen",
    "eighteen",
    "nineteen",
]
_TENS = ["twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]
_WORD_VALUES = {**{w: i for i, w in enumerate(_UNITS)}, **{w: 20 + 10 * i for i, w in enumerate(_TENS)}}
_SCALES = {"hundred": 100, "thousand": 1000, "million": 10**6, "billion": 10**9}
_FRACTION_WORDS = {
    "half": Fraction(1, 2),
    "halves": Fraction(1, 2),
    "third": Fraction(1, 3),
    "thirds": Fraction(1, 3),
    "quarter": Fraction(1, 4),
    "quarters": Fraction(1, 4),
}
_WORD_RUN = re.compile(
    r"\b(?:(?:"
    + "|".join(sorted([*_WORD_VALUES, *_SCALES, *_FRACTION_WORDS], key=len, reverse=True))
    + r")(?:[\s-]+(?:and[\s-]+)?|\b))+",
    re.IGNORECASE,
)
_SPANS = [  # in priority order: a span taken whole hides the numbers inside it (6/2 is 3, not 6 and 2)
    re.compile(r"-?\\[dt]?frac\s*\{[^{}]{1,60}\}\s*\{[^{}]{1,60}\}|-?\\[dt]?frac\s*\d\s*\d"),  # -\frac{14}{2}, \frac12
    re.compile(r"-?\d+(?:\.\d+)?\s*(?:\\times|\\cdot|x|\*)\s*10\s*\^\s*\{?\s*-?\d{1,4}\s*\}?"),  # 7 \times 10^{0}
    re.compile(r"-?\d{1,6}\s*\^\s*(?:\{\s*-?\d{1,5}\s*\}|\d)"),  # 10^3, 2^{10}
    re.compile(r"-?\d+\s*/\s*\d+"),  # 14/2
    re.compile(r"-?[1-9]\d{0,2}(?:,\d{3})+(?:\.\d+)?"),  # 1,000
    re.compile(r"-?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE]-?\d{1,4})?"),  # 7, 7.0, 7., .5, 4.5e3
]
_SPACED = re.compile(r"-?[1-9]\d{0,2}(?: \d{3})+(?:\.\d+)?")  # 1 000, or two numbers (3 100): read both ways
# "minus 3", "negative three", "is - 3", "= - 3"; not "5 - 3" (a difference)
_NEGATED = re.compile(r"(?:\b(?:minus|negative)\s+|(?:^|[(=,:;$A-Za-z])\s*-\s+)$", re.IGNORECASE)


def word_number(words: str) -> Fraction | None:
    """``twenty-one`` → 21, ``three hundred and five`` → 305, ``one half`` → 1/2 (None if not a number)."""
    total = Fraction(0)
    current = Fraction(0)
    seen = False
    for word in re.split(r"[\s-]+", words.lower()):
        if word in ("", "and"):
            continue
        if word in _WORD_VALUES:
            current += _WORD_VALUES[word]
        elif word in _SCALES:
            current = (current or 1) * _SCALES[word]
            if _SCALES[word] >= 1000:
                total, current = total + current, Fraction(0)
        elif word in _FRACTION_WORDS:
            current = (current or 1) * _FRACTION_WORDS[word]
        else:
            return None
        seen = True
    return total + current if seen else None


_MIXED = re.compile(
    r"(?<![\d.])(-?)(\d{1,12})(?!\d)[ \t]{0,4}(?:\\[dt]?frac\{(\d{1,12})\}\{(\d{1,12})\}|[ \t](\d{1,12})/(\d{1,12})(?![\d/]))"
)


def _mixed_value(match: re.Match) -> str:
    """A mixed number's value as a fraction: ``-1\\frac{1}{2}`` is ``-3/2`` (its sign covers the fraction too)."""
    whole, numerator, denominator = (
        int(match.group(2)),
        int(match.group(3) or match.group(5)),
        int(match.group(4) or match.group(6)),
    )
    if denominator == 0:
        return match.group(0)
    value = whole * denominator + numerator
    return f"{match.group(1)}{value}/{denominator}"


def written_numbers(text: str) -> list[str]:
    """Every span of ``text`` that writes a number, in any of the forms lanpo reads (overlapping spans too)."""
    text = clean(text)
    taken: list[tuple[int, int]] = []
    found: list[tuple[int, str]] = []
    for pattern in _SPANS:
        for m in pattern.finditer(text):
            if not any(m.start() < end and start < m.end() for start, end in taken):
                taken.append(m.span())
                found.append((m.start(), m.group(0)))
    found += [(m.start(), m.group(0)) for m in _SPACED.finditer(text)]
    found += [(m.start(), _mixed_value(m)) for m in _MIXED.finditer(text)]  # 1\frac{1}{2}, -2 3/4: their value
    found += [
        (m.start() + len(m.group(0)) - len(m.group(0).lstrip(" -")), m.group(0).strip(" -"))
        for m in _WORD_RUN.finditer(text)
    ]
    # "minus 3", "negative three", "is - 3": a negative number
    return [
        "-" + span if not span.startswith("-") and _NEGATED.search(text, max(0, start - 12), start) else span
        for start, span in found
    ]
