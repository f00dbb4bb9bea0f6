"""Heads and KV groups are values (`headscope.heads.Head`, `KVGroup`); their text names are written and read in
one place, headscope/heads.py.

The guards read every module with `ast`: no other module builds a name like `L3H5` or `L3G1` (f-string, %- or
.format() template, or `+` concatenation), and none reads one with its own regex or split. Each guard is first
shown a planted offender, so it cannot pass by finding nothing.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import headscope
from headscope import HeadscopeError, head_name, parse_head
from headscope.heads import Head, KVGroup, join_heads, read_node, split_heads

ROOT = Path(headscope.__file__).parent
HOME = ROOT / "heads.py"  # the one module allowed to spell the names

# A %- or .format() template of a name: "L%dH%d", "L{}G{}", "L{0}H{1}".
TEMPLATE = re.compile(r"L(%[-+ #0-9.]*[dis]|\{[^{}]*\})[HG](%|\{)")
# A regex for a name: L followed by a digit class or group, with an H or G somewhere after ("L(\d+)H(\d+)").
PATTERN = re.compile(r"L(\(|\\d|\[0-9\])[^\n]*[HG]")
# Splitting a name at its letters, as hand-written parsers do: text.partition("H"), name.split("G"), lstrip("L").
SPLITTERS = {("partition", "H"), ("partition", "G"), ("split", "H"), ("split", "G"), ("lstrip", "L"),
             ("removeprefix", "L")}


def _pieces(node: ast.AST) -> list[ast.AST]:
    """The operands of a chain of `+` (a + b + c -> [a, b, c]); one node alone otherwise."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _pieces(node.left) + _pieces(node.right)
    return [node]


def _text(node: ast.AST) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _spells_a_name(parts: list[ast.AST]) -> bool:
    """Text ending in L, a value, then text starting with H or G: how `L{layer}H{head}` is built by hand."""
    for a, b, c in zip(parts, parts[1:], parts[2:], strict=False):
        left, right = _text(a), _text(c)
        if left is not None and left.endswith("L") and _text(b) is None and right is not None \
                and right.startswith(("H", "G")):
            return True
    return False


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the docstring constants (they may show a name's shape, `L{l}G{g}.k`, in words)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and _text(first.value) is not None:
                out.add(id(first.value))
    return out


def writers(source: str) -> list[int]:
    """Lines of `source` that build a head or KV-group name by hand."""
    tree = ast.parse(source)
    docs = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr) and _spells_a_name(list(node.values)):
            found.append(node.lineno)
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add) and _spells_a_name(_pieces(node)):
            found.append(node.lineno)
        elif id(node) not in docs and TEMPLATE.search(_text(node) or ""):
            found.append(node.lineno)
    return sorted(set(found))


def readers(source: str) -> list[int]:
    """Lines of `source` that read a head or KV-group name with their own regex or split."""
    found = []
    for node in ast.walk(ast.parse(source)):
        text = _text(node)
        if text is not None and PATTERN.search(text):
            found.append(node.lineno)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
            arg = _text(node.args[0])
            if arg is not None and (node.func.attr, arg) in SPLITTERS:
                found.append(node.lineno)
    return sorted(set(found))


def _places(scan) -> list[str]:
    out = []
    for path in sorted(ROOT.rglob("*.py")):
        if path != HOME:
            out += [f"{path.relative_to(ROOT.parent)}:{line}" for line in scan(path.read_text(encoding="utf-8"))]
    return out


def test_the_guards_find_hand_built_and_hand_parsed_names():
    built = ['f"L{l}H{h}"', 'f"{x}: L{l}G{g}.k"', '"L%dH%d" % (l, h)', '"L{}H{}".format(l, h)',
             '"L" + str(l) + "H" + str(h)']
    for line in built:
        assert writers(f"x = {line}\n") == [1], line
    parsed = ['re.compile(r"L(\\d+)H(\\d+)")', 're.match("^L([0-9]+)(H|G)", t)', 't[1:].partition("H")',
              't.split("G")']
    for line in parsed:
        assert readers(f"x = {line}\n") == [1], line
    # what is not a head's name: a layer label, a range of layers and heads, a unit name, the word "Layer"
    fine = ['f"L{l}:{n}"', 'f"L0..L{n - 1} and H0..H{m - 1}"', 'f"F{l}:{n}"', 'f"Layer {l} Head {h}"',
            't.split("+")', 'f"{Head(l, h)}.q"']
    for line in fine:
        assert writers(f"x = {line}\n") == [] and readers(f"x = {line}\n") == [], line
    # a docstring may show a name's shape in words
    assert writers('"""Receivers: `L{l}G{g}.k`."""\n') == []


def test_no_module_but_heads_builds_a_head_name():
    places = _places(writers)
    assert not places, ("head or KV-group names built by hand (use Head(l, h).name / str(head), KVGroup(l, g).name, "
                        "join_heads from headscope.heads):\n  " + "\n  ".join(places))


def test_no_module_but_heads_parses_a_head_name():
    places = _places(readers)
    assert not places, ("head or KV-group names parsed by hand (use Head.parse / Head.read, KVGroup.read, "
                        "split_heads or read_node from headscope.heads):\n  " + "\n  ".join(places))


def test_a_head_is_its_tuple_and_its_name():
    head = Head(3, 5)
    layer, h = head
    assert (layer, h) == (3, 5) and head == (3, 5) and hash(head) == hash((3, 5))
    assert head.name == str(head) == f"{head}" == "L3H5" == head_name(3, 5)
    assert KVGroup(3, 1).name == str(KVGroup(3, 1)) == "L3G1"
    assert sorted([Head(1, 0), Head(0, 7), Head(0, 2)]) == [(0, 2), (0, 7), (1, 0)]


@pytest.mark.parametrize("text, want", [("L3H7", (3, 7)), ("l3h7", (3, 7)), (" L12H0 ", (12, 0)), ("L03H7", (3, 7))])
def test_parse_reads_what_a_user_writes(text, want):
    assert Head.parse(text) == want and isinstance(Head.parse(text), Head) and parse_head(text) == want


@pytest.mark.parametrize("text", ["3.7", "L3", "H7", "L3H", "LxH7", "L3H7.q", "L-1H2", "L3 H7", "L3G1", "",
                                  "L12345H0"])
def test_parse_refuses_anything_else_in_one_line_with_an_example(text):
    with pytest.raises(HeadscopeError) as e:
        Head.parse(text)
    assert str(e.value) == f"cannot read head {text!r}; write heads as L<layer>H<head>, e.g. L3H7"


def test_kv_groups_parse_and_refuse():
    assert KVGroup.parse(" l2g1") == (2, 1) and isinstance(KVGroup.parse("L2G1"), KVGroup)
    with pytest.raises(HeadscopeError, match=r"cannot read KV group 'L2H1'; .* e\.g\. L3G1"):
        KVGroup.parse("L2H1")


def test_read_takes_exactly_the_written_form():
    assert Head.read("L3H5") == (3, 5) and KVGroup.read("L3G1") == (3, 1)
    for odd in ["l3h5", " L3H5", "L3H5 ", "L3G1", "<b>", "", None, 35, ("L3H5",), "L99999H0"]:
        assert Head.read(odd) is None, odd
    assert KVGroup.read("L3H1") is None


def test_a_sender_of_several_heads_round_trips():
    heads = (Head(17, 4), Head(20, 0))
    assert join_heads(heads) == "L17H4+L20H0" and split_heads("L17H4+L20H0") == heads
    assert join_heads([(3, 1)]) == "L3H1" and split_heads("L3H1") == (Head(3, 1),)
    for odd in ["L0H1+<b>", "L0H1+", "+L0H1", "", None, "logits"]:
        assert split_heads(odd) is None, odd


def test_circuit_nodes_read_as_heads_and_kv_groups():
    assert read_node("L3H2") == (Head(3, 2), "") and read_node("L3H2.q") == (Head(3, 2), "q")
    unit, via = read_node("L3G1.k")
    assert isinstance(unit, KVGroup) and unit == (3, 1) and via == "k"
    for other in ["input", "MLP3", "logits", "L3H2.x", "L3H2.", "L3G1.kv", None]:
        assert read_node(other) is None, other


def test_a_kv_group_names_the_query_heads_that_share_it():
    # 12 query heads over 4 KV heads: group 1 is query heads 3, 4, 5 (repeat_kv's order)
    assert KVGroup(2, 1).query_heads(3) == [Head(2, 3), Head(2, 4), Head(2, 5)]
    assert KVGroup(0, 0).query_heads(1) == [Head(0, 0)]


def test_a_table_lists_its_heads_as_heads():
    from headscope import HeadTable

    heads = list(HeadTable(2, 3).heads())
    assert heads == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    assert all(isinstance(h, Head) for h in heads) and [h.name for h in heads][-1] == "L1H2"
