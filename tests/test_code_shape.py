"""The code keeps the shape the layout promises (docs/architecture.md): small modules, short functions, few
modules flat at headscope/, and every function-local import with its reason beside it.

Read with `ast`, not by importing. A limit that a change breaks is a design question (split the module,
name the step), not a number to raise here.
"""

from __future__ import annotations

import ast
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
