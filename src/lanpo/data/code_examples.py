"""A code problem's **public** examples: the calls and values its statement shows (a docstring's ``>>> f(3)`` and
``7`` below it, or HumanEval's ``f(3) ==> 7`` lines), read from the text the model sees.

They are what a programmer runs before submitting, and what ``feedback_source execution`` runs a failed attempt
on (RLEF's split: public examples as feedback, the hidden tests as the reward). Read from the statement alone,
they can hold nothing the model was not shown: a hidden test never reaches them.

``builtin:code`` writes two examples into each docstring (:func:`docstring_examples`), drawn apart from its hidden
tests; HumanEval's statements carry their own; a local file's ``public_tests`` are written below the function as
comment lines (:func:`comment_examples`) and read back from there.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import Any

from lanpo.verify.code import extract_code

MAX_EXAMPLES = 8  # examples read from one statement: a programmer's quick check, not a test suite
MAX_VALUE_LINES = 5  # lines one shown value may span
SEPARATORS = ("==>", "==", "➞", "=>", "->", "should return", "returns", "=")  # "f(x) ==> y" forms, longest first


@dataclass(frozen=True)
class Example:
    """One public example: the call as shown, its positional arguments, and the value shown for it."""

    call: str
    args: tuple
    expected: Any


def _literal(text: str) -> tuple[bool, Any]:
    try:
        return True, ast.literal_eval(text.strip())
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False, None


def _call_args(text: str, entry_point: str) -> tuple | None:
    """The positional arguments of ``text`` when it is one call of ``entry_point`` with literal arguments only."""
    try:
        node = ast.parse(text.strip(), mode="eval").body
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name) or node.func.id != entry_point:
        return None
    if node.keywords or any(isinstance(a, ast.Starred) for a in node.args):
        return None
    args = []
    for arg in node.args:
        ok, value = _literal(ast.unparse(arg))
        if not ok:
            return None
        args.append(value)
    return tuple(args)


def _statement_code(text: str) -> str:
    """The code a statement shows: its fenced block (the problem as lanpo states it), else the text itself."""
    return extract_code(text, "strict") or text


def _entry_point(code: str) -> str | None:
    names = re.findall(r"^(?:async[ \t]+)?def[ \t]+([A-Za-z_]\w*)[ \t]*\(", code, re.MULTILINE)
    return names[-1] if names else None


def statement_function(text: str) -> tuple[str, str | None]:
    """The code a code problem's statement shows, and the function it asks for (the last one it defines)."""
    code = _statement_code(text) if isinstance(text, str) else ""
    return code, _entry_point(code)


def _bare(line: str) -> str:
    """A line without its indentation and a leading comment mark (a local file's examples are comments)."""
    line = line.strip()
    return line[1:].strip() if line.startswith("#") else line


def public_examples(text: str, entry_point: str | None = None) -> list[Example]:
    """The examples a code problem's statement shows for its function (the last one its code defines, unless
    named): ``>>> f(args)`` with the value on the lines below, or ``f(args) SEP value`` on one line (SEP one of
    :data:`SEPARATORS`). Only calls of that function with literal arguments and a literal value count; at most
    :data:`MAX_EXAMPLES`."""
    if not isinstance(text, str):
        return []
    code, last = statement_function(text)
    entry_point = entry_point or last
    if not entry_point:
        return []
    lines = [_bare(line) for line in code.splitlines()]
    found: list[Example] = []
    for index, line in enumerate(lines):
        if len(found) >= MAX_EXAMPLES:
            break
        if line.startswith(">>>"):
            call = line[3:].strip()
            args = _call_args(call, entry_point)
            if args is None:
                continue
            value_lines = []
            for following in lines[index + 1 : index + 1 + MAX_VALUE_LINES]:
                if not following or following.startswith(">>>") or following.startswith('"""'):
                    break
                value_lines.append(following)
            for size in range(1, len(value_lines) + 1):
                ok, value = _literal(" ".join(value_lines[:size]))
                if ok:
                    found.append(Example(call, args, value))
                    break
            continue
        if f"{entry_point}(" not in line:
            continue
        example = _one_line(line[line.index(f"{entry_point}(") :], entry_point)
        if example is not None:
            found.append(example)
    return found


def _one_line(line: str, entry_point: str) -> Example | None:
    """``f(args) SEP value`` as an example: the first split where the left is a call and the right a literal."""
    for separator in SEPARATORS:
        start = 0
        while (at := line.find(separator, start)) != -1:
            call, rest = line[:at].strip(), line[at + len(separator) :].strip()
            start = at + 1
            args = _call_args(call, entry_point)
            if args is None:
                continue
            ok, value = _literal(rest)
            if ok:
                return Example(call, args, value)
    return None


def _shown_call(entry_point: str, args) -> str:
    return f"{entry_point}({', '.join(repr(a) for a in args)})"


def docstring_examples(entry_point: str, cases: list, indent: str = "    ") -> str:
    """``cases`` (``[[args], expected]``) as a docstring's examples, one ``>>>`` line and its value each."""
    return "".join(f"\n{indent}>>> {_shown_call(entry_point, args)}\n{indent}{expected!r}" for args, expected in cases)


def comment_examples(entry_point: str, cases: list) -> str:
    """``cases`` as comment lines below a function: ``# Examples:``, then ``# >>> f(args)`` and ``# value``."""
    lines = ["# Examples:"]
    for args, expected in cases:
        lines += [f"# >>> {_shown_call(entry_point, args)}", f"# {expected!r}"]
    return "\n".join(lines) + "\n"
