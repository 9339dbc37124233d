"""One-token mutants of a solution: what a reward's tests must tell from the solution itself.

A code reward that credits a solution's near miss pays the policy for it. The near misses checked here are the ones
mutation testing names first: a comparison's boundary (``>`` for ``>=``, ``<`` for ``<=``), its sense (``==`` for
``!=``, ``is`` for ``is not``, ``in`` for ``not in``), ``and`` for ``or``, and a whole-number constant off by one
(``x > 4`` for ``x > 5``, ``return -1`` for ``return -2``). Each mutant changes one token of the solution's code
(never its docstring, whose numbers are text) and is returned as source.

``builtin:code`` draws tests that every mutant of its reference fails, unless the mutant is the same function
(:func:`lanpo.data.code_tasks.code_task`); local code files with a solution are reported at load with how many of
its mutants their tests let through (:func:`lanpo.data.loaders.load_code_rows`).
"""

from __future__ import annotations

import ast
from typing import NamedTuple

# comparison operators and the one each is mutated into
SWAPPED_COMPARISONS: dict[type, type] = {
    ast.Gt: ast.GtE,
    ast.GtE: ast.Gt,
    ast.Lt: ast.LtE,
    ast.LtE: ast.Lt,
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
    ast.Is: ast.IsNot,
    ast.IsNot: ast.Is,
    ast.In: ast.NotIn,
    ast.NotIn: ast.In,
}
MAX_MUTANTS = 64  # mutants of one solution (a long solution's first sites, in source order)


class Mutant(NamedTuple):
    """A solution with one token changed."""

    what: str  # the change, for a report ("line 3: > to >=")
    source: str


def _is_number(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and type(node.value) is int


def _sites(tree: ast.Module) -> list[tuple[ast.AST, int | None]]:
    """Every mutable token: (its node, which operand of a comparison, or None), in source order. Docstrings are
    strings, so no site lies in one."""
    sites: list[tuple[ast.AST, int | None]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sites += [(node, k) for k, op in enumerate(node.ops) if type(op) in SWAPPED_COMPARISONS]
        elif isinstance(node, ast.BoolOp) or _is_number(node):
            sites.append((node, None))
    return sorted(sites, key=lambda s: (getattr(s[0], "lineno", 0), getattr(s[0], "col_offset", 0), s[1] or 0))


def _symbol(op: ast.AST) -> str:
    return {
        ast.Gt: ">",
        ast.GtE: ">=",
        ast.Lt: "<",
        ast.LtE: "<=",
        ast.Eq: "==",
        ast.NotEq: "!=",
        ast.Is: "is",
        ast.IsNot: "is not",
        ast.In: "in",
        ast.NotIn: "not in",
        ast.And: "and",
        ast.Or: "or",
    }[type(op)]


def mutants(source: str, limit: int = MAX_MUTANTS) -> list[Mutant]:
    """The one-token mutants of ``source`` (a module of Python code): none where it does not parse. Each is
    unparsed from the changed syntax tree, so comments and layout are not kept (the code's behaviour is)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return []
    found: list[Mutant] = []
    for node, operand in _sites(tree):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Compare):
            old = node.ops[operand]
            new = SWAPPED_COMPARISONS[type(old)]()
            node.ops[operand] = new
            found.append(Mutant(f"line {line}: {_symbol(old)} to {_symbol(new)}", ast.unparse(tree)))
            node.ops[operand] = old
        elif isinstance(node, ast.BoolOp):
            old = node.op
            node.op = ast.Or() if isinstance(old, ast.And) else ast.And()
            found.append(Mutant(f"line {line}: {_symbol(old)} to {_symbol(node.op)}", ast.unparse(tree)))
            node.op = old
        else:
            value = node.value
            for changed in (value - 1, value + 1):
                node.value = changed
                found.append(Mutant(f"line {line}: {value} to {changed}", ast.unparse(tree)))
            node.value = value
        if len(found) >= limit:
            break
    return found[:limit]


def constants_of(source: str) -> list[int]:
    """The whole-number constants of ``source``'s code, each once, in source order (tests probe on and beside
    them)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return []
    seen: list[int] = []
    for node, _ in _sites(tree):
        if _is_number(node) and node.value not in seen:
            seen.append(node.value)
    return seen
