"""Pictures of programs: `Program.to_dot`, `to_svg` and `_repr_html_` (`mplang.edsl.dot`)."""

from __future__ import annotations

import html
import inspect
import re
import shutil
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import pytest

import mplang as mp
from mplang import simp, tensor
from mplang.edsl.dot import html_page
from mplang.edsl.graph import Graph, Operation, Value
from mplang.edsl.program import Program
from mplang.edsl.pytree import tree_flatten
from mplang.edsl.typing import Mask, MPType, scalar

needs_dot = pytest.mark.skipif(shutil.which("dot") is None,
                               reason="graphviz's dot program is not installed")
NO_DOT = ("the graphviz `dot` program is not installed; install it (apt install graphviz) "
          "or use to_dot()")


# ---------------------------------------------------------------- reading DOT text


@dataclass
class Dot:
    """The parts of a DOT text the tests look at: clusters, nodes and edges."""

    cluster_labels: dict[str, str] = field(default_factory=dict)
    cluster_parents: dict[str, list[str]] = field(default_factory=dict)
    """Each cluster's enclosing clusters, outermost first."""
    nodes: dict[str, tuple[list[str], str]] = field(default_factory=dict)
    """node -> (its clusters, outermost first; its label)"""
    edges: list[tuple[str, str, str, str]] = field(default_factory=list)
    """(source, target, label, the raw attribute text)"""

    def lane(self, node: str) -> str:
        return self.cluster_labels[self.nodes[node][0][0]]

    def nodes_labelled(self, text: str) -> list[str]:
        return [n for n, (_, label) in self.nodes.items() if text in label]


def _unquote(attrs: str, key: str = "label") -> str:
    m = re.search(rf'\b{key}=(?:"((?:[^"\\]|\\.)*)"|(\S+))', attrs)
    assert m, attrs
    raw = m.group(1) if m.group(1) is not None else m.group(2)
    return re.sub(r"\\(.)", lambda e: "\n" if e.group(1) == "n" else e.group(1), raw)


def parse_dot(text: str) -> Dot:
    dot, stack = Dot(), []
    for line in text.splitlines():
        if m := re.fullmatch(r"\s*subgraph (\w+) \{", line):
            dot.cluster_parents[m.group(1)] = list(stack)
            stack.append(m.group(1))
        elif re.fullmatch(r"\s*\}", line):
            if stack:
                stack.pop()
        elif m := re.fullmatch(r"\s*(\w+) -> (\w+) \[(.*)\]", line):
            dot.edges.append((m.group(1), m.group(2), _unquote(m.group(3)), m.group(3)))
        elif m := re.fullmatch(r"\s*(\w+) \[(.*)\]", line):
            if m.group(1) not in ("node", "edge"):
                dot.nodes[m.group(1)] = (list(stack), _unquote(m.group(2)))
        elif stack and re.match(r"\s*\w+=", line):
            dot.cluster_labels[stack[-1]] = _unquote(line)
    return dot


def line_of(fn: Callable[..., Any], text: str) -> str:
    """``test_dot.py:LINE`` of the first line of ``fn``'s source containing ``text``."""
    lines, start = inspect.getsourcelines(fn)
    index = next(i for i, line in enumerate(lines) if text in line)
    return f"test_dot.py:{start + index}"


# ---------------------------------------------------------------- programs


def readme_prog(a):
    x = simp.constant((0,), a)
    y = simp.pcall((0,), lambda v: tensor.run_jax(jnp.square, v), x)
    return simp.shuffle_static(y, {1: 0})


def loop_prog():
    start = simp.constant((0, 1, 2), 1)
    return simp.while_loop(lambda v: simp.pcall((0, 1, 2), lambda a: a < 10, v),
                           lambda v: simp.pcall((0, 1, 2), lambda a: a * 2, v), start)


def cond_prog():
    x = simp.constant((0, 1), 5)
    pred = simp.pcall((0, 1), lambda v: v > 1, x)
    return simp.uniform_cond(pred, lambda v: simp.shuffle_static(v, {0: 1, 1: 0}),
                             lambda v: v, x)


def millionaire():
    x = mp.device("P0")(lambda: jnp.int32(1_000_000))()
    y = mp.device("P1")(lambda: jnp.int32(2_000_000))()
    z = mp.device("SP0")(lambda a, b: a < b)(x, y)
    return mp.put("P0", z)


# ---------------------------------------------------------------- DOT


def test_readme_program_has_party_lanes_and_a_communication_edge() -> None:
    program = mp.compile(readme_prog, 3, world_size=3)
    dot = parse_dot(program.to_dot())
    assert dot.cluster_labels["cluster_party_0"] == "party 0"
    assert dot.cluster_labels["cluster_party_1"] == "party 1"
    assert "cluster_party_2" not in dot.cluster_labels  # party 2 runs nothing
    [constant] = dot.nodes_labelled("simp.constant")
    [pcall] = dot.nodes_labelled("= simp.pcall")
    [square] = dot.nodes_labelled("tensor.run_jax")
    [shuffle] = dot.nodes_labelled("simp.shuffle_static")
    assert [dot.lane(n) for n in (constant, pcall, square, shuffle)] == [
        "party 0", "party 0", "party 0", "party 1"]
    # the one edge between lanes: party 0's pcall result moves to party 1
    crossing = [e for e in dot.edges if dot.lane(e[0]) != dot.lane(e[1])]
    assert [(e[0], e[1], e[2]) for e in crossing] == [
        (pcall, shuffle, "simp.shuffle_static\ni32[]@{0}")]
    assert "style=bold" in crossing[0][3]
    assert (constant, pcall, "i32[]@{0}") in [e[:3] for e in dot.edges]
    # the pcall's region is a cluster inside party 0's lane, holding the pcall and its body
    region = dot.nodes[square][0]
    assert region == dot.nodes[pcall][0] == ["cluster_party_0", region[1]]
    assert dot.cluster_labels[region[1]] == "simp.pcall"
    # labels: op, attributes, types, the user's source line, the program output
    assert dot.nodes[constant][1] == (
        f"%0 = simp.constant\nparties={{0}}, value=3:int32\ni32[]@{{0}}\n"
        f"{line_of(readme_prog, 'simp.constant')}")
    assert dot.nodes[shuffle][1].endswith(
        f"i32[]@{{1}}\n{line_of(readme_prog, 'shuffle_static')}\noutput #0")


def test_dot_is_deterministic() -> None:
    first = mp.compile(readme_prog, 3, world_size=3).to_dot()
    assert mp.compile(readme_prog, 3, world_size=3).to_dot() == first
    assert mp.compile(readme_prog, 4, world_size=3).to_dot() != first  # it shows the value
    loop = mp.compile(loop_prog, world_size=3)
    assert loop.to_dot() == Program.from_bytes(loop.to_bytes()).to_dot()


def test_while_loop_regions_are_nested_clusters_in_each_lane() -> None:
    program = mp.compile(loop_prog, world_size=3)
    dot = parse_dot(program.to_dot())
    loops = dot.nodes_labelled("simp.while_loop")
    assert sorted(dot.lane(n) for n in loops) == ["party 0", "party 1", "party 2"]
    for party in range(3):
        [loop] = [n for n in loops if dot.lane(n) == f"party {party}"]
        loop_cluster = dot.nodes[loop][0][-1]
        assert dot.cluster_labels[loop_cluster] == "simp.while_loop"
        regions = [c for c, parents in dot.cluster_parents.items()
                   if parents and parents[-1] == loop_cluster]
        assert [dot.cluster_labels[c] for c in regions] == ["region 0", "region 1"]
        cond_body = [n for n in dot.nodes_labelled("tensor.run_jax")
                     if dot.lane(n) == f"party {party}"]
        assert [dot.cluster_labels[dot.nodes[n][0][2]] for n in cond_body] == [
            "region 0", "region 1"]
        # the loop state enters both regions from the loop's node (dotted)
        entering = [e for e in dot.edges if e[0] == loop]
        assert len(entering) == 2 and all("style=dotted" in e[3] for e in entering)
    assert not [e for e in dot.edges if dot.lane(e[0]) != dot.lane(e[1])]


def test_communication_inside_a_branch_crosses_lanes_within_the_region() -> None:
    program = mp.compile(cond_prog, world_size=2)
    dot = parse_dot(program.to_dot())
    moves = dot.nodes_labelled("simp.shuffle_static")
    crossing = sorted((dot.lane(s), dot.lane(t)) for s, t, label, _ in dot.edges
                      if label.startswith("simp.shuffle_static\n"))
    assert crossing == [("party 0", "party 1"), ("party 1", "party 0")]
    for node in moves:
        clusters = dot.nodes[node][0]
        assert [dot.cluster_labels[c] for c in clusters[1:]] == ["simp.uniform_cond", "region 0"]


def test_device_program_shows_sharing_and_reveal_between_lanes() -> None:
    cluster = mp.ClusterSpec.simple(3)
    program = mp.compile(millionaire, cluster=cluster)
    dot = parse_dot(program.to_dot(party_names=[n.name for n in cluster.nodes]))
    assert [dot.cluster_labels[f"cluster_party_{i}"] for i in range(3)] == [
        "party 0 (node_0)", "party 1 (node_1)", "party 2 (node_2)"]

    def crossing(opcode: str) -> list[tuple[str, str]]:
        return sorted((dot.lane(s)[:7], dot.lane(t)[:7]) for s, t, label, _ in dot.edges
                      if label.startswith(opcode + "\n"))

    # each private input is shared from its owner's lane to the two other members
    assert crossing("spu.seal") == [("party 0", "party 1"), ("party 0", "party 2"),
                                    ("party 1", "party 0"), ("party 1", "party 2")]
    # the joint computation runs in every lane; the reveal gathers shares on party 0
    assert sorted(dot.lane(n)[:7] for n in dot.nodes_labelled("spu.run")) == [
        "party 0", "party 1", "party 2"]
    assert crossing("spu.reveal") == [("party 1", "party 0"), ("party 2", "party 0")]
    [reveal] = dot.nodes_labelled("spu.reveal")
    assert dot.lane(reveal) == "party 0 (node_0)" and "output #0" in dot.nodes[reveal][1]


NOTE = 'quote " backslash \\ ' + "x" * 80


def _dynamic_graph() -> Graph:
    base = scalar("int32")
    x = Value("0", MPType(base, Mask.of([0])))
    moved = Value("1", MPType(base, None))
    out = Value("2", MPType(base, Mask.of([0, 1])))
    return Graph([x], [
        Operation("simp.shuffle", (x, x), (moved,), {"note": NOTE}, loc="prog.py:3"),
        Operation("simp.converge", (moved,), (out,), loc="prog.py:4"),
    ], [out])


def test_unknown_holders_go_to_the_dynamic_lane_and_long_text_is_clipped() -> None:
    graph = _dynamic_graph()
    program = Program(graph, tree_flatten(0)[1], 2, "dyn")
    dot = parse_dot(program.to_dot())
    [move] = dot.nodes_labelled("simp.shuffle")
    merges = dot.nodes_labelled("simp.converge")
    assert dot.lane(move) == "dynamic / all parties"
    assert [dot.lane(n) for n in merges] == ["party 0", "party 1"]
    [inp] = dot.nodes_labelled("(input)")
    assert dot.lane(inp) == "party 0" and dot.nodes[inp][1] == "%0 (input)\ni32[]@{0}"
    # the input used twice gives one edge; the dynamic value reaches both holders
    assert [(s, t, label) for s, t, label, _ in dot.edges] == [
        (inp, move, "simp.shuffle\ni32[]@{0}"), (move, merges[0], "i32[]@?"),
        (move, merges[1], "i32[]@?")]
    attr_line = dot.nodes[move][1].split("\n")[1]
    assert attr_line == ("note=" + repr(NOTE))[:47] + "…"


@needs_dot
def test_svg_has_the_lanes_and_escaped_labels() -> None:
    program = mp.compile(readme_prog, 3, world_size=3)
    root = ET.fromstring(program.to_svg())
    texts = [t.text for t in root.iter("{http://www.w3.org/2000/svg}text")]
    assert "party 0" in texts and "party 1" in texts
    assert "%4 = simp.shuffle_static" in texts
    odd = Program(_dynamic_graph(), tree_flatten(0)[1], 2, "dyn")
    texts = [t.text for t in ET.fromstring(odd.to_svg()).iter(
        "{http://www.w3.org/2000/svg}text")]
    assert ("note=" + repr(NOTE))[:47] + "…" in texts


@needs_dot
def test_repr_html_is_the_svg_picture() -> None:
    program = mp.compile(readme_prog, 3, world_size=3)
    shown = program._repr_html_()
    assert shown.startswith("<svg") and "party 1" in shown
    assert shown == program.to_svg()[program.to_svg().index("<svg"):]


def test_without_dot_html_falls_back_to_the_text_ir(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no `dot` program to be found
    program = mp.compile(readme_prog, 3, world_size=3)
    assert program._repr_html_() == f"<pre>{html.escape(str(program))}</pre>"
    assert "fn=&#x27;&lt;lambda&gt;&#x27;" in program._repr_html_()
    with pytest.raises(mp.MPLangError) as e:
        program.to_svg()
    assert str(e.value) == NO_DOT
    assert program.to_dot().startswith("digraph readme_prog {")  # DOT needs no program


def test_html_page_holds_the_picture_and_the_text() -> None:
    page = html_page("p<1>", "func @p() -> () {\n}", '<?xml version="1.0"?>\n<svg a="b"></svg>')
    assert "<title>p&lt;1&gt;</title>" in page and '\n<svg a="b"></svg>\n' in page
    assert "<pre>func @p() -&gt; () {\n}</pre>" in page and "<?xml" not in page
    assert "not installed" in html_page("p", "ir", None)
