"""Pictures of a graph: a `graphviz.Digraph` with one lane per party, and its SVG.

How a graph is drawn:

- **Lanes.** One cluster per party (``party 0``, or ``party 0 (node_0)`` with party
  names), and a lane ``dynamic / all parties`` for what no type places on a known
  party (holders known only at run time, or ops outside any party).
- **Placement.** An op runs on the parties holding its results (the party sets
  of their types); without a multi-party result, on those holding its inputs;
  inside a party-local region, on the party of the enclosing op. It is drawn
  once in the lane of each such party, so SPMD code reads as what each party
  does, and an op held by three parties appears in three lanes.
- **Data edges** join a value's producer to its consumer in the same lane and are
  labelled with the value's type.
- **Communication.** An op whose traits say it communicates takes an input from
  its own party's copy and also from every holder that does not run the op (the
  copies that must travel); a party without a copy takes it from every holder,
  or from the source its ``routes`` {dst: src} attribute names. Edges that cross
  lanes are bold, red and labelled with the op name and the moved value's type.
  Communicating ops have a red border (their internal rounds are not drawn).
- **Regions.** An op with regions is a dashed cluster holding its node and its
  regions' ops (one nested cluster per region when it has several). Region
  inputs come from the op's node (dotted edges); region results are not drawn
  back, so the picture has no cycles.

Node labels carry the result names and op name, the attributes, the result
types and the user's source line; long texts are clipped. The output is
deterministic: the same graph gives the same DOT text.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from html import escape as html_escape
from typing import TYPE_CHECKING

from mplang.edsl.errors import MPLangError
from mplang.edsl.graph import Graph, Operation, Value
from mplang.edsl.printer import format_attr
from mplang.edsl.typing import Mask, MPType

if TYPE_CHECKING:
    import graphviz

Lane = int | None
"""A party's rank, or None: the dynamic lane."""
Frame = tuple[int, Operation, int]
"""An enclosing region: (the op's number, the op, the region's index)."""

TYPE_LIMIT = 40
"""Longest type text in a label or on an edge (longer ones are clipped)."""
ATTR_LIMIT = 48
"""Longest attribute line in a node label."""
COMM_COLOR = "#c0392b"
DYNAMIC_LANE = "dynamic / all parties"
_NO_DOT = ("the graphviz `dot` program is not installed; install it (apt install graphviz) "
           "or use to_dot()")


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _label(lines: Sequence[str]) -> str:
    """A DOT label of ``lines``, taken literally (no escapes, no HTML)."""
    import graphviz

    return graphviz.nohtml("\\n".join(line.replace("\\", "\\\\") for line in lines))


def _key(lane: Lane) -> str:
    return "any" if lane is None else f"p{lane}"


def _lanes(op: Operation, inherited: tuple[Lane, ...]) -> tuple[Lane, ...]:
    """The lanes ``op`` is drawn in (see the module docstring)."""
    masks = [v.type.pmask for v in op.outputs if isinstance(v.type, MPType)]
    if not masks:
        masks = [v.type.pmask for v in op.inputs if isinstance(v.type, MPType)]
    if not masks:
        return inherited
    if any(m is None for m in masks):
        return (None,)
    union = Mask(0)
    for m in masks:
        if m is not None:
            union |= m
    return union.parties or inherited


@dataclass
class _Cluster:
    name: str
    attrs: dict[str, str]
    nodes: list[tuple[str, dict[str, str]]] = field(default_factory=list)
    children: dict[str, _Cluster] = field(default_factory=dict)

    def child(self, name: str, label: str) -> _Cluster:
        if name not in self.children:
            self.children[name] = _Cluster(name, {"label": label, "style": "rounded,dashed",
                                                  "color": "#7f8c8d"})
        return self.children[name]

    def emit(self, graph: graphviz.Digraph) -> None:
        with graph.subgraph(name=self.name) as sub:
            sub.attr(**self.attrs)
            for node, attrs in self.nodes:
                sub.node(node, **attrs)
            for cluster in self.children.values():
                cluster.emit(sub)


class _Picture:
    """Collects lanes, nodes and edges while walking a graph once."""

    def __init__(self, graph: Graph, party_names: Sequence[str]) -> None:
        self.party_names = party_names
        self.lanes: dict[Lane, _Cluster] = {}
        self.edges: dict[tuple[str, str, str], dict[str, str]] = {}
        self.instances: dict[int, dict[Lane, str]] = {}
        """For each value (by id): its node in each lane holding it."""
        self.entering: set[int] = set()
        """Region inputs (by id): their edges are dotted."""
        self.outputs: dict[int, list[int]] = {}
        for index, v in enumerate(graph.outputs):
            self.outputs.setdefault(id(v), []).append(index)
        self.count = 0

    def lane(self, lane: Lane) -> _Cluster:
        if lane not in self.lanes:
            if lane is None:
                label, fill = DYNAMIC_LANE, "#fef9e7"
            else:
                name = self.party_names[lane] if lane < len(self.party_names) else None
                label, fill = f"party {lane}" + (f" ({name})" if name else ""), "#f4f6f7"
            name = "cluster_dynamic" if lane is None else f"cluster_party_{lane}"
            self.lanes[lane] = _Cluster(name, {
                "label": label, "style": "filled", "fillcolor": fill, "color": "#aab7b8",
                "labeljust": "l"})
        return self.lanes[lane]

    def cluster(self, lane: Lane, frames: Sequence[Frame]) -> _Cluster:
        at = self.lane(lane)
        for number, op, region in frames:
            at = at.child(f"cluster_op{number}_{_key(lane)}", op.opcode)
            if len(op.regions) > 1:
                at = at.child(f"cluster_op{number}_r{region}_{_key(lane)}", f"region {region}")
        return at

    def define(self, v: Value, lane: Lane, node: str) -> None:
        self.instances.setdefault(id(v), {})[lane] = node

    def output_lines(self, values: Sequence[Value]) -> list[str]:
        indices = [i for v in values for i in self.outputs.get(id(v), [])]
        return [f"output #{', #'.join(map(str, indices))}"] if indices else []

    def inputs(self, graph: Graph) -> None:
        for index, v in enumerate(graph.inputs):
            pmask = v.type.pmask if isinstance(v.type, MPType) else None
            for lane in (pmask.parties if pmask else None) or (None,):
                node = f"in{index}_{_key(lane)}"
                lines = [f"%{v.name} (input)", _clip(str(v.type), TYPE_LIMIT),
                         *self.output_lines([v])]
                self.lane(lane).nodes.append((node, {
                    "label": _label(lines), "shape": "box", "style": "dashed"}))
                self.define(v, lane, node)

    def ops(self, ops: Sequence[Operation], frames: tuple[Frame, ...],
            inherited: tuple[Lane, ...]) -> None:
        for op in ops:
            number = self.count
            self.count += 1
            lanes = _lanes(op, inherited)
            communicates = op.traits.communicates
            attrs = self.node_attrs(op, communicates)
            for lane in lanes:
                node = f"op{number}_{_key(lane)}"
                holder = self.cluster(lane, frames)
                if op.regions:
                    holder = holder.child(f"cluster_op{number}_{_key(lane)}", op.opcode)
                holder.nodes.append((node, attrs))
                for v in op.inputs:
                    for source, source_lane in self.sources(v, lane, op, lanes, communicates):
                        self.edge(source, node, v, source_lane != lane,
                                  op if communicates else None)
                for v in op.outputs:
                    self.define(v, lane, node)
            for index, region in enumerate(op.regions):
                for v in region.inputs:
                    self.entering.add(id(v))
                    for lane in lanes:
                        self.define(v, lane, f"op{number}_{_key(lane)}")
                self.ops(region.operations, (*frames, (number, op, index)), lanes)

    def sources(self, v: Value, lane: Lane, op: Operation, op_lanes: tuple[Lane, ...],
                communicates: bool) -> list[tuple[str, Lane]]:
        """The nodes (and their lanes) the instance of ``op`` in ``lane`` reads ``v`` from."""
        held = self.instances.get(id(v), {})
        routes = op.attrs.get("routes") if communicates else None
        if isinstance(routes, Mapping) and lane in routes and routes[lane] in held:
            return [(held[routes[lane]], routes[lane])]
        if lane not in held:
            return [(node, at) for at, node in held.items()]
        travelling = [(node, at) for at, node in held.items()
                      if communicates and at not in op_lanes]
        return [(held[lane], lane), *travelling]

    def edge(self, source: str, target: str, v: Value, crosses: bool,
             communicating: Operation | None) -> None:
        kind = _clip(str(v.type), TYPE_LIMIT)
        attrs: dict[str, str] = {"label": _label([kind])}
        if crosses and communicating is not None:
            attrs = {"label": _label([communicating.opcode, kind]), "style": "bold",
                     "color": COMM_COLOR, "fontcolor": COMM_COLOR, "penwidth": "2"}
        elif crosses:
            attrs["style"] = "dashed"
        elif id(v) in self.entering:
            attrs["style"] = "dotted"
        self.edges.setdefault((source, target, attrs["label"]), attrs)

    def node_attrs(self, op: Operation, communicates: bool) -> dict[str, str]:
        names = _clip(", ".join(f"%{v.name}" for v in op.outputs), TYPE_LIMIT)
        lines = [f"{names} = {op.opcode}" if names else op.opcode]
        shown = ", ".join(f"{k}={format_attr(v)}" for k, v in sorted(op.attrs.items())
                          if k != "module")
        if shown:
            lines.append(_clip(shown, ATTR_LIMIT))
        if op.outputs:
            lines.append(_clip(", ".join(str(v.type) for v in op.outputs), TYPE_LIMIT))
        if op.loc:
            lines.append(op.loc)
        returned = self.output_lines(op.outputs)
        attrs = {"label": _label([*lines, *returned]), "shape": "box", "style": "rounded"}
        if communicates:
            attrs.update(color=COMM_COLOR, penwidth="2")
        if returned:
            attrs["peripheries"] = "2"
        return attrs


def to_digraph(graph: Graph, name: str = "main",
               party_names: Sequence[str] = ()) -> graphviz.Digraph:
    """Draw ``graph`` as a `graphviz.Digraph` (layout rules: the module docstring).

    ``party_names[i]`` (e.g. a cluster's node names) labels party i's lane.
    """
    import graphviz

    picture = _Picture(graph, party_names)
    picture.inputs(graph)
    picture.ops(graph.operations, (), (None,))
    digraph = graphviz.Digraph(name=name)
    digraph.attr(rankdir="TB", newrank="true", fontname="Helvetica", label=name,
                 labelloc="t")
    digraph.attr("node", fontname="Helvetica", fontsize="10")
    digraph.attr("edge", fontname="Helvetica", fontsize="9")
    for lane in sorted(picture.lanes, key=lambda lane: (lane is None, lane or 0)):
        picture.lanes[lane].emit(digraph)
    for (source, target, _), attrs in picture.edges.items():
        digraph.edge(source, target, **attrs)
    return digraph


def render_svg(digraph: graphviz.Digraph) -> str:
    """The SVG document of ``digraph``, laid out by graphviz's ``dot`` program.

    Raises `MPLangError` when ``dot`` is not installed or fails.
    """
    import graphviz

    try:
        svg: str = digraph.pipe(format="svg", encoding="utf-8")
    except graphviz.ExecutableNotFound:
        raise MPLangError(_NO_DOT) from None
    except graphviz.CalledProcessError as e:
        detail = (e.stderr or b"").decode(errors="replace").strip()
        raise MPLangError(f"graphviz `dot` failed to lay out {digraph.name}: {detail}; "
                          "use to_dot() for the DOT source") from None
    return svg


def svg_element(svg: str) -> str:
    """``svg`` without its XML prolog: the ``<svg>`` element, to embed in HTML."""
    start = svg.find("<svg")
    return svg[start:] if start >= 0 else svg


def html_page(title: str, text_ir: str, svg: str | None) -> str:
    """A standalone HTML page: the picture (when ``svg`` is given) and the text IR."""
    picture = svg_element(svg) if svg is not None else (
        "<p>No picture: graphviz's <code>dot</code> program is not installed "
        "(apt install graphviz).</p>")
    return ("<!DOCTYPE html>\n<html>\n<head>\n<meta charset=\"utf-8\">\n"
            f"<title>{html_escape(title)}</title>\n</head>\n<body>\n"
            f"<h1>{html_escape(title)}</h1>\n{picture}\n<h2>IR</h2>\n"
            f"<pre>{html_escape(text_ir)}</pre>\n</body>\n</html>\n")
