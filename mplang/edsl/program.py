"""`Program`: a traced, typed graph plus the pytree shape of its outputs."""

from __future__ import annotations

import html
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mplang.edsl.dot import render_svg, svg_element, to_digraph
from mplang.edsl.errors import MPLangError, MPSerializationError, MPVerifyError
from mplang.edsl.graph import Graph
from mplang.edsl.object import MPObject
from mplang.edsl.primitive import check_types
from mplang.edsl.printer import format_graph
from mplang.edsl.pytree import TreeDef
from mplang.edsl.serde import decode_graph_bundle, encode_graph_bundle
from mplang.edsl.text_parser import parse_program
from mplang.edsl.text_printer import format_program
from mplang.edsl.tracer import Tracer, trace_function
from mplang.edsl.typing import MAX_PARTIES, ValueType

if TYPE_CHECKING:
    import graphviz


@dataclass(eq=False)
class Program:
    """A compiled program: runs on ``world_size`` parties.

    Its graph inputs are the runtime inputs (MPLang objects) it takes, in order;
    ``str(program)`` is the IR text. ``received``: it was read from bytes or text
    (`load`, `from_bytes`, `from_text`), not traced in this process, so its native
    payloads are vetted before this process runs any of its ops.
    """

    graph: Graph
    out_tree: TreeDef
    world_size: int
    name: str = "main"
    out_devices: tuple[str | None, ...] = ()
    received: bool = False

    def __post_init__(self) -> None:
        if not self.out_devices:
            self.out_devices = (None,) * len(self.graph.outputs)
        if len(self.out_devices) != len(self.graph.outputs):
            raise ValueError("one device entry per output is required")

    @property
    def input_types(self) -> list[ValueType]:
        """The types of the program's runtime inputs, in order."""
        return [v.type for v in self.graph.inputs]

    @property
    def output_types(self) -> list[ValueType]:
        """The types of the program's outputs, in order."""
        return [v.type for v in self.graph.outputs]

    def __str__(self) -> str:
        return format_graph(self.graph, self.name)

    def to_graphviz(self, party_names: Sequence[str] = ()) -> graphviz.Digraph:
        """The program as a `graphviz.Digraph`: one lane per party, communication as
        edges between lanes, regions as nested clusters (see `mplang.edsl.dot`).

        ``party_names[i]`` (e.g. the cluster's node names) labels party i's lane.
        """
        return to_digraph(self.graph, self.name, party_names)

    def to_dot(self, party_names: Sequence[str] = ()) -> str:
        """The DOT source of `to_graphviz` (deterministic text)."""
        source: str = self.to_graphviz(party_names).source
        return source

    def to_svg(self, party_names: Sequence[str] = ()) -> str:
        """The picture as an SVG document; raises `MPLangError` without graphviz's ``dot``."""
        return render_svg(self.to_graphviz(party_names))

    def _repr_html_(self) -> str:
        """Jupyter's view: the SVG picture, or the text IR when ``dot`` is missing."""
        try:
            return svg_element(self.to_svg())
        except MPLangError:
            return f"<pre>{html.escape(str(self))}</pre>"

    def to_bytes(self) -> bytes:
        """The program serialized: its graph bundle (JSON plus raw buffers) and metadata."""
        meta = {"name": self.name, "world_size": self.world_size,
                "out_tree": self.out_tree.to_json(), "out_devices": list(self.out_devices)}
        return encode_graph_bundle(self.graph, meta)

    @staticmethod
    def from_bytes(data: bytes) -> Program:
        """The program `to_bytes` wrote; every field is checked (`MPSerializationError`
        names the first malformed one) and nothing is unpickled or evaluated."""
        return _checked_program(*decode_graph_bundle(data))

    def to_text(self) -> str:
        """The whole program as text (`mplang.edsl.text_printer`): its name, world size,
        output tree and devices, and every op with all its attributes, regions, types
        and location. `from_text` reads it back to the same program (the same bytes)."""
        return format_program(self.graph, self.name, self.world_size, self.out_tree.to_json(),
                              self.out_devices)

    @staticmethod
    def from_text(text: str) -> Program:
        """The program `to_text` wrote (or a hand-edited one), checked like `from_bytes`;
        a malformed text raises `MPSerializationError` naming its line and column."""
        return _checked_program(*parse_program(text))

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the program's serialized bytes (deterministic, no pickle) to ``path``."""
        with open(path, "wb") as f:
            f.write(self.to_bytes())


def _checked_program(graph: Graph, meta: Any) -> Program:
    """The program of a decoded graph and its metadata, checked field by field, then
    verified and type-checked (`MPSerializationError` names what is wrong)."""
    try:
        name, world_size = meta["name"], meta["world_size"]
        out_tree = TreeDef.from_json(meta["out_tree"])
        out_devices = tuple(meta["out_devices"])
    except (KeyError, TypeError, ValueError) as e:
        raise MPSerializationError(f"malformed program metadata: {e}") from None
    if not (isinstance(name, str) and type(world_size) is int
            and 0 < world_size <= MAX_PARTIES):
        raise MPSerializationError(f"malformed program metadata (world_size is 1 to "
                                   f"{MAX_PARTIES})")
    if out_tree.num_leaves != len(graph.outputs) or len(out_devices) != len(graph.outputs):
        raise MPSerializationError("output tree does not match the graph outputs")
    if not all(d is None or isinstance(d, str) for d in out_devices):
        raise MPSerializationError("malformed program metadata: output devices")
    try:
        graph.verify()
        check_types(graph, world_size)
    except MPVerifyError as e:
        raise MPSerializationError(f"invalid program: {e}") from None
    return Program(graph, out_tree, world_size, name, out_devices, received=True)


def load(path: str | os.PathLike[str]) -> Program:
    """Read a program written by `Program.save`; an error names the file."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise MPLangError(f"mp.load: no such program file: {os.fspath(path)} (write one with "
                          "mp.compile(fn, ...).save(PATH))") from None
    try:
        return Program.from_bytes(data)
    except MPSerializationError as e:
        e.args = (f"{os.fspath(path)}: {e.args[0]}", *e.args[1:])
        raise


def trace_program(
    fn: Callable[..., Any], args: Sequence[Any], kwargs: dict[str, Any], world_size: int,
    cluster: Any = None, executor: Any = None,
) -> tuple[Program, list[MPObject]]:
    """Trace ``fn`` into a program; also return the runtime objects it takes as inputs.

    ``cluster`` (a `ClusterSpec`) lets device-level code resolve device names;
    ``executor`` (the execution context the program is for) answers questions about
    the parties' data (``tensor.load`` types).
    """
    traced = trace_function(Tracer(world_size, cluster=cluster, executor=executor), fn, args,
                            kwargs)
    traced.graph.verify()
    name = getattr(fn, "__name__", "main")
    if not name.isidentifier():
        name = "main"
    program = Program(traced.graph, traced.out_tree, world_size, name,
                      tuple(traced.out_devices))
    return program, traced.captured
