"""Flow rules of the simp, tensor and func dialects (see `mplang.policy.flows`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mplang.dialects import func, simp, tensor
from mplang.dialects.common import LRUCache
from mplang.edsl.graph import Operation
from mplang.frontend.errors import MPLangError
from mplang.policy.flows import Analysis, PartyLabels, everywhere, flow_rule, local_flow_rule, merge
from mplang.policy.labels import Label, join, raw, source
from mplang.policy.tensor_flows import transfer

_TEXTS = LRUCache(256)
"""(reader, payload bytes) -> module text (StableHLO or pphlo)."""


def module_text(read: Callable[[bytes], str], payload: bytes) -> str | None:
    """The text ``read`` gives of a tensor program's payload (None if it cannot be read)."""
    text: str | None = _TEXTS.lookup((read, payload))
    if text is None:
        try:
            text = read(payload)
        except (MPLangError, ValueError, RuntimeError):
            return None
        _TEXTS.store((read, payload), text)
    return text


def through(read: Callable[[bytes], str], payload: Any, ins: list[Label], n: int
            ) -> list[Label]:
    """Labels through a tensor program whose text ``read`` gives; raw from every input if
    it cannot be followed."""
    if all(lab is None for lab in ins):
        return [None] * n
    text = module_text(read, bytes(payload))
    outs = transfer(text, ins) if text is not None else None
    return outs if outs is not None and len(outs) == n else [raw(ins)] * n


def _stablehlo(module: bytes) -> str:
    return str(tensor.exported_module(module).mlir_module())


# ---------------------------------------------------------------- party-local ops


@local_flow_rule(tensor.constant_p)
def _constant(a: Analysis, op: Operation, ins: list[Label], own: bool) -> list[Label]:
    return [None]


@local_flow_rule(tensor.run_jax_p)
def _run_jax(a: Analysis, op: Operation, ins: list[Label], own: bool) -> list[Label]:
    return through(_stablehlo, op.attrs["module"], ins, len(op.outputs))


@local_flow_rule(tensor.pyfunc_p)
def _pyfunc(a: Analysis, op: Operation, ins: list[Label], own: bool) -> list[Label]:
    return [raw(ins)] * len(op.outputs)


@local_flow_rule(func.call_p)
def _local_call(a: Analysis, op: Operation, ins: list[Label], own: bool) -> list[Label]:
    return a.local(op.regions[0], ins, own)


if hasattr(tensor, "load_p"):
    @local_flow_rule(tensor.load_p)
    def _tensor_load(a: Analysis, op: Operation, ins: list[Label], own: bool) -> list[Label]:
        if not own:
            return [None]
        name = str(op.attrs["path"]) + (f"[{op.attrs['key']}]" if op.attrs.get("key") else "")
        a.source(op, name)
        return [source(name)]


# ---------------------------------------------------------------- simp


@flow_rule(simp.constant_p, simp.prank_p)
def _no_data(a: Analysis, op: Operation, ins: list[PartyLabels]) -> list[PartyLabels]:
    return [{} for _ in op.outputs]


if hasattr(simp, "load_p"):
    @flow_rule(simp.load_p)
    def _simp_load(a: Analysis, op: Operation, ins: list[PartyLabels]) -> list[PartyLabels]:
        if op.attrs["party"] != a.party:
            return [{}]
        name = str(op.attrs["name"])
        a.source(op, name)
        return [{a.party: source(name)}]


@flow_rule(simp.pcall_p)
def _pcall(a: Analysis, op: Operation, ins: list[PartyLabels]) -> list[PartyLabels]:
    """Each party runs the body on its own copies; only p's run reads p's sources.
    Parties decided at run time: every party that may hold the outputs."""
    parties = op.attrs["parties"]
    runners = list(parties) if parties is not None else \
        sorted({q for v in op.outputs for q in a.holders(v)} or range(a.world_size))
    outs: list[PartyLabels] = [{} for _ in op.outputs]
    for q in runners:
        mine = [lab.get(q) for lab in ins]
        if q != a.party and all(lab is None for lab in mine):
            continue
        for out, lab in zip(outs, a.local(op.regions[0], mine, q == a.party), strict=True):
            if lab is not None:
                out[q] = lab
    return outs


@flow_rule(simp.shuffle_static_p)
def _shuffle_static(a: Analysis, op: Operation, ins: list[PartyLabels]) -> list[PartyLabels]:
    routes: dict[int, int] = op.attrs["routes"]
    outs = []
    for value in ins:
        out: PartyLabels = {}
        for dst, src in routes.items():
            label = value.get(src)
            if label is not None:
                out[dst] = label
                if dst != src:
                    a.send(op, dst, label, f"the value party {src} sends")
        outs.append(out)
    return outs


@flow_rule(simp.shuffle_p)
def _shuffle(a: Analysis, op: Operation, ins: list[PartyLabels]) -> list[PartyLabels]:
    """Any source may answer any index holder; each index goes to every source."""
    value, index = ins
    label = everywhere(value)
    out: PartyLabels = {}
    for q in a.holders(op.outputs[0]):
        if label is not None:
            out[q] = label
            a.send(op, q, label, "the value (its source is chosen at run time)")
    for q, idx in index.items():
        for src in a.holders(op.inputs[0]):
            if src != q:
                a.send(op, src, idx, "the index party " + str(q) + " asks with")
    return [out]


@flow_rule(simp.converge_p)
def _converge(a: Analysis, op: Operation, ins: list[PartyLabels]) -> list[PartyLabels]:
    out: PartyLabels = {}
    for value in ins:
        out = merge(out, value)
    return [out]


def _revealed_predicate(a: Analysis, op: Operation, pred: PartyLabels) -> Label:
    """A predicate every party must agree on is revealed to every party."""
    label = everywhere(pred)
    for q in range(a.world_size):
        a.send(op, q, label, "the predicate every party sees")
    return label


def _with(values: list[PartyLabels], label: Label) -> list[PartyLabels]:
    """Each copy also depends on ``label`` (control dependence)."""
    if label is None:
        return values
    return [{q: join(lab, label) or label for q, lab in v.items()} for v in values]


@flow_rule(simp.uniform_cond_p)
def _uniform_cond(a: Analysis, op: Operation, ins: list[PartyLabels]) -> list[PartyLabels]:
    pred = _revealed_predicate(a, op, ins[0])
    then_out = a.graph(op.regions[0], ins[1:])
    else_out = a.graph(op.regions[1], ins[1:])
    return _with([merge(x, y) for x, y in zip(then_out, else_out, strict=True)], pred)


@flow_rule(simp.while_loop_p)
def _while_loop(a: Analysis, op: Operation, ins: list[PartyLabels]) -> list[PartyLabels]:
    cond, body = op.regions
    n = len(body.outputs)
    captured = ins[n:]
    preds: list[Label] = []

    def step(state: list[PartyLabels]) -> list[PartyLabels]:
        preds.append(_revealed_predicate(a, op, a.graph(cond, state + captured)[0]))
        return a.graph(body, state + captured)

    state = a.loop(ins[:n], step)
    pred = _revealed_predicate(a, op, a.graph(cond, state + captured)[0])
    for p in preds:
        pred = join(pred, p)
    return _with(state, pred)


@flow_rule(func.call_p)
def _call(a: Analysis, op: Operation, ins: list[PartyLabels]) -> list[PartyLabels]:
    return a.graph(op.regions[0], ins)
