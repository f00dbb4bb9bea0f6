"""The package's import graph has no cycle: every module can be understood (and imported) before its users.

Read with `ast`, not by importing: an edge A -> B for every `import`/`from ... import` of a headscope
module in A, at module level and inside functions alike (a function-local import is a cycle that
waits for its call). Imports under `if TYPE_CHECKING:` never run and are left out. `from pkg import
name` points at the submodule `pkg.name` when there is one, else at the package `pkg`.
"""

from __future__ import annotations

import ast
from pathlib import Path

import headscope

ROOT = Path(headscope.__file__).parent


def _modules() -> dict[str, tuple[Path, bool]]:
    """Dotted module name -> (file, is_package) for every module under headscope/."""
    out = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        out[".".join(parts[:-1] if is_pkg else parts)] = (path, is_pkg)
    return out


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    """ids of the import nodes inside `if TYPE_CHECKING:` blocks."""
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                skip.update(id(n) for n in ast.walk(child))
    return skip


def import_graph() -> dict[str, set[str]]:
    """Module -> the headscope modules it imports (anywhere in the file)."""
    mods = _modules()
    graph: dict[str, set[str]] = {}
    for name, (path, is_pkg) in mods.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        skip = _type_checking_nodes(tree)
        package = name if is_pkg else name.rpartition(".")[0]
        deps: set[str] = set()
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            if isinstance(node, ast.Import):
                deps.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                for a in node.names:
                    deps.add(f"{target}.{a.name}" if f"{target}.{a.name}" in mods else target)
        graph[name] = {d for d in deps if d in mods and d != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (as a path a -> ... -> a) per strongly connected component of more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def visit(v: str) -> None:  # Tarjan's algorithm; the graph has ~60 nodes, recursion is fine
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                components.append(comp)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    out = []
    for comp in components:
        start = min(comp)
        # shortest way back to start inside the component (breadth-first), to print a readable cycle
        prev: dict[str, str] = {}
        frontier = [start]
        while frontier and start not in prev:
            nxt = []
            for v in frontier:
                for w in sorted(graph[v] & comp):
                    if w not in prev:
                        prev[w] = v
                        nxt.append(w)
            frontier = nxt
        path = [start]
        while True:
            path.append(prev[path[-1]])
            if path[-1] == start:
                break
        out.append(path[::-1])
    return out


def test_the_graph_reader_sees_local_and_relative_imports():
    """The reader itself: a cycle through a function-local relative import is found."""
    graph = import_graph()
    assert "headscope.models.adapter" in graph["headscope.models.checkpoint"]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_foundation_does_not_import_stages():
    """models/ must not depend on the stages built on it (prune, gqa, curves, ...)."""
    graph = import_graph()
    models = [m for m in graph if m.startswith("headscope.models")]
    allowed = ("headscope.models", "headscope.errors", "headscope.io", "headscope.heads")  # heads: names of heads
    bad = {m: sorted(d for d in graph[m] if not d.startswith(allowed)) for m in models}
    assert not any(bad.values()), f"models/ imports stages: { {m: d for m, d in bad.items() if d} }"


def test_layout_is_self_contained():
    """models/layout.py is copied into pruned checkpoints as their loader: stdlib and torch only."""
    tree = ast.parse((ROOT / "models" / "layout.py").read_text(encoding="utf-8"))
    roots = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"relative import in layout.py: from {'.' * node.level}{node.module} import ..."
            roots.add((node.module or "").split(".")[0])
    assert roots <= {"__future__", "copy", "dataclasses", "typing", "torch"}, sorted(roots)


def test_no_import_cycles():
    found = cycles(import_graph())
    assert not found, "import cycles:\n" + "\n".join(" -> ".join(c) for c in found)


# The layers of the tree (README, "How the code is organised"): a package may import only the layers listed
# for it. The foundation imports no question package; each question package stands on the foundation and,
# where the layout says so, on `learned` (redundancy and capacity read what heads learn, never the reverse).
FOUNDATION = ("models", "attention", "data", "eval", "uncertainty", "options", "hooks", "heads", "stats", "table",
              "train", "distributed", "io", "artifacts", "registry", "errors", "provenance", "plots", "version")
LAYERS = {
    "foundation": ("foundation",),
    "learned": ("foundation", "learned"),
    "capacity": ("foundation", "learned", "capacity"),
    "redundancy": ("foundation", "learned", "redundancy"),
    "export": ("foundation", "learned", "capacity", "redundancy", "export"),
    "compare": ("foundation", "learned", "capacity", "redundancy", "compare"),
    "report": ("foundation", "learned", "capacity", "redundancy", "export", "report"),
    "view": ("foundation", "learned", "capacity", "redundancy", "export", "report", "view"),
    "commands": ("foundation", "learned", "capacity", "redundancy", "export", "compare", "report", "view",
                 "commands"),
    # study runs the verbs' library functions with their Options, never the CLI layer (commands/, argv)
    "study": ("foundation", "learned", "capacity", "redundancy", "export", "compare", "report", "study"),
    "cli": ("foundation", "commands", "study", "cli"),
}


def layer_of(module: str) -> str:
    """The layer a headscope module belongs to ('api' for the package itself and __main__)."""
    parts = module.split(".")
    if len(parts) == 1 or parts[1] == "__main__":
        return "api"
    return "foundation" if parts[1] in FOUNDATION else parts[1]


def test_every_module_has_a_layer():
    unknown = sorted(m for m in import_graph() if layer_of(m) not in (*LAYERS, "api"))
    assert not unknown, f"modules outside the layers (add their package to FOUNDATION or LAYERS): {unknown}"


def test_layers_import_only_what_the_layout_allows():
    graph = import_graph()
    bad = {m: sorted(d for d in deps if layer_of(d) not in LAYERS[layer_of(m)])
           for m, deps in graph.items() if layer_of(m) in LAYERS}
    bad = {m: d for m, d in bad.items() if d}
    lines = [f"  {m} -> {', '.join(d)}" for m, d in sorted(bad.items())]
    assert not bad, "imports across the layers:\n" + "\n".join(lines)


def test_few_flat_modules_at_the_top():
    flat = sorted(p.name for p in ROOT.glob("*.py"))
    assert len(flat) <= 15, f"{len(flat)} modules flat at headscope/ (at most 15): {flat}"
