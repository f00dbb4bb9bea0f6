"""The code keeps the shape the layout promises (docs/architecture.md): small modules, short functions, few
modules flat at headscope/, and every function-local import with its reason beside it.

Read with `ast`, not by importing. A limit that a change breaks is a design question (split the module,
name the step), not a number to raise here.
"""

from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path

import headscope

ROOT = Path(headscope.__file__).parent
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 80
MAX_FLAT_MODULES = 15  # modules directly under headscope/, __init__ and __main__ included


def _sources() -> list[tuple[Path, str]]:
    return [(p, p.read_text(encoding="utf-8")) for p in sorted(ROOT.rglob("*.py"))]


def test_no_module_over_the_line_limit():
    long = {str(p.relative_to(ROOT)): n for p, src in _sources() if (n := len(src.splitlines())) > MAX_MODULE_LINES}
    assert not long, f"modules over {MAX_MODULE_LINES} lines: {long}"


def test_no_function_over_the_line_limit():
    long = []
    for path, src in _sources():
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({n} lines)")
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines: {long}"


def test_few_modules_flat_at_the_top():
    flat = sorted(p.name for p in ROOT.glob("*.py"))
    assert len(flat) <= MAX_FLAT_MODULES, f"{len(flat)} modules flat at headscope/: {flat}"


def local_imports_without_reason(src: str) -> list[int]:
    """Line numbers of function-local imports with no comment on their line, on the line above, or on the
    first import of the consecutive group they belong to."""
    lines = src.splitlines()
    bare = []
    for fn in ast.walk(ast.parse(src)):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        body_imports = [s for s in ast.walk(fn) if isinstance(s, (ast.Import, ast.ImportFrom))]
        for node in body_imports:
            first = node.lineno
            while first - 1 >= 1 and lines[first - 2].lstrip().startswith(("from ", "import ")):
                first -= 1  # the group's first import
            said = any("#" in lines[i - 1] for i in (node.lineno, first)) or \
                lines[first - 2].lstrip().startswith("#")
            if not said:
                bare.append(node.lineno)
    return sorted(set(bare))


def test_function_local_imports_say_why():
    bare = {str(p.relative_to(ROOT)): lines for p, src in _sources() if (lines := local_imports_without_reason(src))}
    assert not bare, f"function-local imports without a reason (a comment beside them): {bare}"


def test_the_local_import_check_can_fail():
    src = "def f():\n    import os\n    return os\n\n\ndef g():\n    import sys  # only for g's rare path\n"
    assert local_imports_without_reason(src) == [2]


# Past a dozen parameters a function reads better taking its verb's Options or a settings record (issue 41:
# convert_and_evaluate takes GqaOptions / MlaOptions, score a ScoreSettings, roles a RoleSettings, similarity a
# SimilaritySettings). The functions left above 12 take their extra arguments by keyword only: the kernel's inner
# walk `fused_rows` and `long_roles` (15), the registration decorators `role` and `register_metric`, whose
# keywords are the fields of the entry they register (14), and `uptrain` (13).
MAX_PARAMETERS = 15
MAX_POSITIONAL_ARGUMENTS = 7


def n_parameters(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Every parameter a caller can pass (`self` and `cls` not counted; *args and **kwargs count one each)."""
    a = fn.args
    named = [*a.posonlyargs, *a.args]
    bound = 1 if named and named[0].arg in ("self", "cls") else 0
    return len(named) - bound + len(a.kwonlyargs) + (a.vararg is not None) + (a.kwarg is not None)


def functions_with_many_parameters(src: str, limit: int) -> list[tuple[int, str, int]]:
    """(line, name, parameters) of every function in `src` with more than `limit` parameters."""
    return [(fn.lineno, fn.name, n) for fn in ast.walk(ast.parse(src))
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and (n := n_parameters(fn)) > limit]


def calls_with_many_positional_arguments(src: str, limit: int) -> list[tuple[int, str, int]]:
    """(line, callee, positional arguments) of every call in `src` passing more than `limit` by position."""
    return [(call.lineno, ast.unparse(call.func), len(call.args)) for call in ast.walk(ast.parse(src))
            if isinstance(call, ast.Call) and len(call.args) > limit]


def test_no_function_takes_too_many_parameters():
    many = []
    for path, src in _sources():
        where = str(path.relative_to(ROOT))
        many += [f"{where}:{line} {name} ({n} parameters)"
                 for line, name, n in functions_with_many_parameters(src, MAX_PARAMETERS)]
    assert not many, f"functions with more than {MAX_PARAMETERS} parameters (take Options or a settings record): {many}"


def test_no_call_passes_too_many_arguments_by_position():
    benchmarks = sorted((ROOT.parent / "benchmarks").rglob("*.py"))
    sources = [*_sources(), *((p, p.read_text(encoding="utf-8")) for p in benchmarks)]
    many = []
    for path, src in sources:
        where = str(path.relative_to(ROOT if path.is_relative_to(ROOT) else ROOT.parent))
        many += [f"{where}:{line} {callee} ({n} positional)"
                 for line, callee, n in calls_with_many_positional_arguments(src, MAX_POSITIONAL_ARGUMENTS)]
    assert not many, f"calls passing more than {MAX_POSITIONAL_ARGUMENTS} arguments by position (name them): {many}"


def test_the_parameter_and_call_checks_can_fail():
    src = ("class A:\n    def m(self, a, b, /, c, *d, e, **f):\n        return g(1, 2, 3, x=4)\n\n\n"
           "def h(a, b, c):\n    return g(a, b, c, *a)\n")
    assert functions_with_many_parameters(src, 5) == [(2, "m", 6)]
    assert sorted(functions_with_many_parameters(src, 2)) == [(2, "m", 6), (6, "h", 3)]
    assert calls_with_many_positional_arguments(src, 3) == [(7, "g", 4)]
    assert sorted(calls_with_many_positional_arguments(src, 2)) == [(3, "g", 3), (7, "g", 4)]


# A comment of this length or more goes on its own line above the code it explains, not squeezed onto the code
# line (pragmas such as type-ignore and noqa markers stay where their tools read them).
MAX_TRAILING_COMMENT = 60
PRAGMAS = ("type:", "noqa", "pragma", "fmt:")


def long_trailing_comments(src: str, limit: int) -> list[int]:
    """Line numbers of comments of `limit` characters or more that follow code on their line."""
    first: dict[int, int] = {}
    lines = []
    tokens = list(tokenize.generate_tokens(io.StringIO(src).readline))
    skip = (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER)
    for t in tokens:
        if t.type not in skip:
            first.setdefault(t.start[0], t.start[1])
    for t in tokens:
        pragma = t.string.removeprefix("#").lstrip().startswith(PRAGMAS)
        if t.type == tokenize.COMMENT and first.get(t.start[0]) != t.start[1] and len(t.string) >= limit \
                and not pragma:
            lines.append(t.start[0])
    return lines


def test_no_long_comment_squeezed_onto_a_code_line():
    squeezed = [f"{path.relative_to(ROOT)}:{line}" for path, src in _sources()
                for line in long_trailing_comments(src, MAX_TRAILING_COMMENT)]
    assert not squeezed, (f"comments of {MAX_TRAILING_COMMENT}+ characters after code (put them on their own line "
                          f"above): {squeezed}")


def test_the_trailing_comment_check_can_fail():
    src = ("x = 1  # " + "a" * 60 + "\n# " + "b" * 70 + "\ny = 2  # short\n"
           "z = f(  # type: ignore[x]  " + "c" * 60 + "\n)\n")
    assert long_trailing_comments(src, MAX_TRAILING_COMMENT) == [1]
