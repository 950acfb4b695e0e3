"""A party's policy: which drivers and protocols it accepts, what may leave it and
which files programs may write into its data root.

A policy is a YAML mapping; every key is optional::

    # policies/node_0.yaml: what node_0 accepts and what may leave it
    drivers: [driver]            # driver names (from the spec) accepted; absent: every driver
                                 # the spec lists
    plaintext_to: []             # parties (node names, or "driver") that may receive this
                                 # node's plaintext data, raw or derived (default: none)
    protocols: [CHEETAH, ABY3]   # secure-device protocols accepted (default: CHEETAH, ABY3,
                                 # and SEMI2K only where this node is its own dealer: the
                                 # device's first member with Beaver TrustedFirstParty)
    psi_protocols: [rr22, aby3]  # PSI protocols it joins with (default: those revealing
                                 # only their result, `DEFAULT_PSI_PROTOCOLS`)
    programs: []                 # allow-listed program digests (hex): every reveal allowed
    approve:                     # releases approved by name, beyond the declassify rules
      - library: mplang.libs.linear.train_vertical_lr  # a library function its members
        to: [node_0]             # derive themselves (or a module of mplang.libs: each such
                                 # function in it); its outputs may go to these receivers
      - program: 9f2c...         # a reviewed program's digest (as in programs)
    max_uses: {salaries: 3}      # uploaded object name -> how many executions may use it
    writes: []                   # files programs may write, relative to the data root;
                                 # glob patterns allowed (out/*.csv); default: none
    declassify:                  # rules for revealing values derived from this node's data
      - {to: ["*"], when: aggregate, min_rows: 10}  # sums, means, counts, variances, model
                                 # updates over >= 10 distinct rows of this node's data,
                                 # each row weighted alike
      - {to: ["*"], when: compare}   # a comparison between values of different owners
      - {to: [node_1], when: intersection}  # a PSI join may show node_1 which of its
                                 # keys this node's table holds
      - {to: [node_1], when: aggregate, min_rows: 50, max_releases: 3}  # at most 3 releases
                                 # per source under this rule, over every program
      - {to: ["*"], when: dp, max_epsilon: 1.0, budget: 10.0}  # noisy releases, charged
                                 # per release

A rule's ``to`` lists receivers: ``"driver"`` (any accepted driver), node names, or
``"*"`` (anyone). ``when`` is the form of the revealed value it allows:
``aggregate`` (``min_rows``: an integer >= 1, default 1), ``compare``,
``intersection`` (which keys a PSI join matched), ``dp``
(``max_epsilon``: a number > 0, required; ``budget``: a number > 0, optional) or
``any`` (every form). A key that does not fit the rule's form is an error.

``writes`` patterns match a path component by component (``*``, ``?`` and ``[...]``
never cross a ``/``): ``out/*.csv`` allows ``out/a.csv``, not ``out/x/a.csv`` nor
``a.csv``. An absolute path or one with a ``..`` component never matches.

A malformed file is a `PolicyError` naming the file, the line and the key.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import TYPE_CHECKING

from mplang.edsl.errors import MPLangError
from mplang.policy.psi_protocols import DEFAULT_PSI_PROTOCOLS, PSI_PROTOCOLS

if TYPE_CHECKING:
    import yaml

DRIVER = "driver"
"""The receiver name standing for any driver the policy accepts."""
ANYONE = "*"
FORMS = ("aggregate", "compare", "intersection", "dp", "any")
"""Values of a declassification rule's ``when``."""
DEFAULT_PROTOCOLS = ("CHEETAH", "ABY3")
"""Protocols accepted by default: none of them makes one party the others' dealer."""
_DIGEST = re.compile(r"[0-9a-f]{64}")
_KEYS = ("drivers", "plaintext_to", "protocols", "psi_protocols", "programs", "approve",
         "max_uses", "writes", "declassify")
_LIBRARY = re.compile(r"mplang\.libs(\.[A-Za-z_][A-Za-z0-9_]*)+")
_RULE_KEYS = {"aggregate": ("min_rows", "max_releases"), "compare": ("max_releases",),
              "intersection": (), "dp": ("max_epsilon", "budget"), "any": ()}
"""The keys a rule of each form may have besides ``to`` and ``when``."""
_ALL_RULE_KEYS = ("to", "when", "min_rows", "max_releases", "max_epsilon", "budget")
_REPLACED = {"min_elements": "min_rows (the number of distinct rows of this party's data "
                             "an aggregate combines)"}
"""Rule keys of the former format, and what replaces each."""
_PLAIN_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")
_YAML_WORDS = frozenset({"y", "n", "yes", "no", "true", "false", "on", "off", "null"})


class PolicyError(MPLangError):
    """A policy file is malformed; the message names the file, line and key to fix."""


def _flow_name(name: str) -> str:
    """``name`` as it is written in a YAML flow sequence (quoted where it must be)."""
    if _PLAIN_NAME.fullmatch(name) and name.lower() not in _YAML_WORDS:
        return name
    return '"' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'


@dataclass(frozen=True)
class DeclassifyRule:
    """Values of form ``when`` may go to the receivers ``to``: aggregates only over at
    least ``min_rows`` rows; dp releases of at most ``max_epsilon`` each, ``budget`` in
    all; aggregates and comparisons at most ``max_releases`` times per source, over every
    program. ``line``: the rule's line in its policy file."""

    to: tuple[str, ...]
    when: str
    min_rows: int = 1
    max_epsilon: float | None = None
    budget: float | None = None
    line: int = 0
    max_releases: int | None = None

    def __str__(self) -> str:
        parts = [f"to: [{', '.join(_flow_name(n) for n in self.to)}]", f"when: {self.when}"]
        if self.when == "aggregate":
            parts.append(f"min_rows: {self.min_rows}")
        if self.max_releases is not None:
            parts.append(f"max_releases: {self.max_releases}")
        if self.max_epsilon is not None:
            parts.append(f"max_epsilon: {self.max_epsilon!r}")
        if self.budget is not None:
            parts.append(f"budget: {self.budget!r}")
        return "{" + ", ".join(parts) + "}"


@dataclass(frozen=True)
class Approval:
    """An ``approve`` entry: the outputs of library function ``library`` (or of every
    approvable function of module ``library``) may go to ``to``; or the program of digest
    ``program`` may reveal anything. ``line``: its line in its policy file."""

    library: str = ""
    to: tuple[str, ...] = ()
    program: str = ""
    line: int = 0

    def covers(self, name: str, receiver: str) -> bool:
        """Whether it approves the outputs of library function ``name`` to ``receiver``."""
        return bool(self.library) and (name == self.library or name.startswith(
            self.library + ".")) and (receiver in self.to or ANYONE in self.to)

    def __str__(self) -> str:
        if self.program:
            return f"{{program: {self.program}}}"
        return f"{{library: {self.library}, to: [{', '.join(map(_flow_name, self.to))}]}}"


def _relative_parts(path: str) -> tuple[str, ...] | None:
    """The components of relative path ``path`` (``.`` and empty ones dropped), or None
    if it is absolute, has a ``..`` component or names nothing."""
    text = path.replace("\\", "/")
    if text.startswith("/") or re.match(r"[A-Za-z]:", text):
        return None
    parts = tuple(p for p in text.split("/") if p not in ("", "."))
    return parts if parts and ".." not in parts else None


@dataclass(frozen=True)
class Policy:
    """One party's policy (see the module docstring for the file format)."""

    drivers: tuple[str, ...] | None = None
    plaintext_to: tuple[str, ...] = ()
    protocols: tuple[str, ...] | None = None
    psi_protocols: tuple[str, ...] = DEFAULT_PSI_PROTOCOLS
    """The PSI protocols this party takes part in."""
    programs: frozenset[str] = frozenset()
    """Allow-listed digests: ``programs`` and the ``approve`` entries' ``program``."""
    approve: tuple[Approval, ...] = ()
    max_uses: Mapping[str, int] = field(default_factory=dict)
    declassify: tuple[DeclassifyRule, ...] = ()
    writes: tuple[str, ...] = ()
    """Patterns of the files (relative to the data root) programs may write."""
    source: str = "the default policy"
    text: str = field(default="", compare=False, repr=False)
    """The YAML it was parsed from (empty for the default policy)."""

    @staticmethod
    def default() -> Policy:
        """Every driver of the spec, no plaintext recipients, no declassification, the
        default protocols, no writes."""
        return Policy()

    @staticmethod
    def load(path: str | os.PathLike[str]) -> Policy:
        """Parse the policy file ``path``; raises `PolicyError` naming the line."""
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except OSError as e:
            raise PolicyError(f"cannot read policy {os.fspath(path)}: {e.strerror or e}"
                              ) from None
        return Policy.parse(text, os.fspath(path))

    @staticmethod
    def parse(text: str, source: str = "<policy>") -> Policy:
        """Parse policy YAML ``text`` (``source`` names it in errors)."""
        import yaml

        try:
            root = yaml.compose(text, Loader=yaml.SafeLoader)
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            where = f"{source}:{mark.line + 1}" if mark is not None else source
            raise PolicyError(f"{where}: not valid YAML: {getattr(e, 'problem', e)}") from None
        if root is None:
            return Policy(source=source, text=text)
        p = _Parser(source)
        entries = p.mapping(root, "the policy")
        unknown = [k for k in entries if k not in _KEYS]
        if unknown:
            raise p.error(entries[unknown[0]][0], f"unknown key {unknown[0]!r} (known: "
                          f"{', '.join(_KEYS)})")

        def names(key: str) -> tuple[str, ...] | None:
            return None if key not in entries else tuple(p.strings(entries[key][1], key))

        programs = names("programs") or ()
        for digest, node in zip(programs, p.items(entries["programs"][1]) if programs else [],
                                strict=True):
            if not _DIGEST.fullmatch(digest):
                raise p.error(node, f"programs: {digest!r} is not a sha256 digest (64 "
                              "lowercase hex digits)")
        max_uses: dict[str, int] = {}
        if "max_uses" in entries:
            for name, (_, value) in p.mapping(entries["max_uses"][1], "max_uses").items():
                max_uses[name] = p.count(value, f"max_uses.{name}", 0)
        writes = p.patterns(entries["writes"][1]) if "writes" in entries else ()
        rules = tuple(p.rule(node) for node in p.items(entries["declassify"][1])) \
            if "declassify" in entries else ()
        psi = p.choices(entries["psi_protocols"][1], "psi_protocols", PSI_PROTOCOLS) \
            if "psi_protocols" in entries else DEFAULT_PSI_PROTOCOLS
        approve = tuple(p.approval(node) for node in p.items(entries["approve"][1])) \
            if "approve" in entries else ()
        programs = (*programs, *(a.program for a in approve if a.program))
        return Policy(drivers=names("drivers"), plaintext_to=names("plaintext_to") or (),
                      protocols=names("protocols"), psi_protocols=psi,
                      programs=frozenset(programs), approve=approve,
                      max_uses=max_uses, declassify=rules, writes=writes, source=source,
                      text=text)

    # -- decisions
    def accepts_driver(self, driver: str) -> bool:
        return self.drivers is None or driver in self.drivers

    def accepts_protocol(self, protocol: str, beaver: str, own_dealer: bool) -> bool:
        """Whether a secure device of ``protocol`` (SEMI2K: Beaver source ``beaver``) may
        hold this party's shares; ``own_dealer``: this party is the device's first member."""
        if self.protocols is not None:
            return protocol in self.protocols
        if protocol in DEFAULT_PROTOCOLS:
            return True
        return protocol == "SEMI2K" and beaver == "TrustedFirstParty" and own_dealer

    def may_receive_plaintext(self, receiver: str) -> bool:
        return receiver in self.plaintext_to or ANYONE in self.plaintext_to

    def may_write(self, path: str) -> bool:
        """Whether programs may write ``path`` (relative to the data root): some pattern
        of `writes` matches it component by component. An absolute path or one with a
        ``..`` component never matches."""
        parts = _relative_parts(path)
        if parts is None:
            return False
        return any(len(pattern) == len(parts) and all(
            fnmatchcase(part, glob) for part, glob in zip(parts, pattern, strict=True))
            for pattern in (p.split("/") for p in self.writes))

    def rule_for(self, receiver: str, form: str, rows: int | None,
                 epsilon: float = 0.0) -> DeclassifyRule | None:
        """The first declassification rule letting ``receiver`` get a value of ``form``
        (``aggregate``, ``compare`` or ``dp``); an aggregate over ``rows`` distinct rows
        of this party's data (None: not known) needs ``rows >= min_rows``, a dp release
        of ``epsilon`` needs ``epsilon <= max_epsilon``. None: no rule does."""
        for rule in self.declassify:
            if receiver not in rule.to and ANYONE not in rule.to:
                continue
            if rule.when == "any":
                return rule
            if rule.when != form:
                continue
            if form == "aggregate" and (rows is None or rows < rule.min_rows):
                continue
            if form == "dp" and epsilon > (rule.max_epsilon or 0.0):
                continue
            return rule
        return None

    def approvals(self, receiver: str, names: frozenset[str]) -> list[Approval] | None:
        """The ``approve`` entries letting ``receiver`` get the outputs of every library
        function of ``names``, one each (None: some function is not approved to it)."""
        found = [next((a for a in self.approve if a.covers(n, receiver)), None)
                 for n in sorted(names)]
        return None if None in found else [a for a in found if a is not None]

    def dp_budget(self) -> float | None:
        """The epsilon each source of this party's data may spend in all: the smallest
        ``budget`` of its dp rules (None: no dp rule sets one)."""
        budgets = [r.budget for r in self.declassify if r.when == "dp" and r.budget]
        return min(budgets) if budgets else None


class _Parser:
    """Typed access to composed YAML nodes; errors carry the node's line."""

    def __init__(self, source: str):
        self.source = source

    def error(self, node: yaml.Node, message: str) -> PolicyError:
        return PolicyError(f"{self.source}:{node.start_mark.line + 1}: {message}")

    def mapping(self, node: yaml.Node, what: str) -> dict[str, tuple[yaml.Node, yaml.Node]]:
        import yaml

        if not isinstance(node, yaml.MappingNode):
            raise self.error(node, f"{what} must be a mapping")
        out: dict[str, tuple[yaml.Node, yaml.Node]] = {}
        for key, value in node.value:
            if not isinstance(key, yaml.ScalarNode):
                raise self.error(key, f"{what}: keys must be names")
            if key.value in out:
                raise self.error(key, f"{what}: key {key.value!r} is given twice")
            out[key.value] = (key, value)
        return out

    def items(self, node: yaml.Node) -> Sequence[yaml.Node]:
        import yaml

        if not isinstance(node, yaml.SequenceNode):
            raise self.error(node, "expected a list ([a, b] or '- a' lines)")
        return node.value

    def strings(self, node: yaml.Node, key: str) -> list[str]:
        import yaml

        out = []
        for item in self.items(node):
            if not isinstance(item, yaml.ScalarNode) or not item.value or \
                    item.tag != "tag:yaml.org,2002:str":
                raise self.error(item, f"{key}: every entry must be a name")
            out.append(item.value)
        return out

    def choices(self, node: yaml.Node, key: str, known: Sequence[str]) -> tuple[str, ...]:
        """A list of names, each one of ``known``."""
        names = self.strings(node, key)
        for item, name in zip(self.items(node), names, strict=True):
            if name not in known:
                raise self.error(item, f"{key}: unknown {name!r} (known: {', '.join(known)})")
        return tuple(names)

    def patterns(self, node: yaml.Node) -> tuple[str, ...]:
        """``writes``: relative path patterns, normalized (``./`` and doubled ``/`` gone)."""
        out = []
        for item, text in zip(self.items(node), self.strings(node, "writes"), strict=True):
            parts = _relative_parts(text)
            if parts is None:
                raise self.error(item, f"writes: {text!r} must be a path relative to the data "
                                 "root, without '..' (e.g. out/*.csv)")
            out.append("/".join(parts))
        return tuple(out)

    def count(self, node: yaml.Node, key: str, low: int) -> int:
        import yaml

        if not (isinstance(node, yaml.ScalarNode) and node.tag == "tag:yaml.org,2002:int"):
            raise self.error(node, f"{key} must be an integer")
        value = int(node.value)
        if value < low:
            raise self.error(node, f"{key} must be at least {low}, got {value}")
        return value

    def positive(self, node: yaml.Node, key: str) -> float:
        """A number > 0 (``1``, ``0.5``, ``1e-3``)."""
        import yaml

        value = math.nan
        if isinstance(node, yaml.ScalarNode) and node.style is None and node.tag in (
                "tag:yaml.org,2002:int", "tag:yaml.org,2002:float", "tag:yaml.org,2002:str"):
            with contextlib.suppress(ValueError):  # not a number: refused below
                value = float(node.value.replace("_", ""))
        if not (math.isfinite(value) and value > 0):
            raise self.error(node, f"{key} must be a number greater than 0, got "
                             f"{getattr(node, 'value', node.tag)!r}")
        return value

    def approval(self, node: yaml.Node) -> Approval:
        """An ``approve`` entry: ``{library: NAME, to: [...]}`` or ``{program: DIGEST}``."""
        import yaml

        entries = self.mapping(node, "an approve entry")
        for key, (key_node, _) in entries.items():
            if key not in ("library", "to", "program"):
                raise self.error(key_node, f"approve: unknown key {key!r} (known: library, "
                                 "to, program)")
        value = {k: v.value for k, (_, v) in entries.items() if isinstance(v, yaml.ScalarNode)}
        if "program" in entries:
            if set(entries) != {"program"} or not _DIGEST.fullmatch(value.get("program", "")):
                raise self.error(node, "approve: a program entry is {program: DIGEST} alone, "
                                 "DIGEST a sha256 digest (64 lowercase hex digits)")
            return Approval(program=value["program"], line=node.start_mark.line + 1)
        if set(entries) != {"library", "to"}:
            raise self.error(node, "approve: an entry is {library: NAME, to: [...]} or "
                             "{program: DIGEST}")
        if not _LIBRARY.fullmatch(value.get("library", "")):
            raise self.error(entries["library"][1], "approve: library must name a function "
                             f"or module of mplang.libs, got {value.get('library')!r}")
        return Approval(value["library"], tuple(self.strings(entries["to"][1], "approve.to")),
                        line=node.start_mark.line + 1)

    def rule(self, node: yaml.Node) -> DeclassifyRule:
        import yaml

        entries = self.mapping(node, "a declassify rule")
        for key, (key_node, _) in entries.items():
            if key in _REPLACED:
                raise self.error(key_node, f"declassify: {key} is no longer a key; use "
                                 f"{_REPLACED[key]}")
            if key not in _ALL_RULE_KEYS:
                raise self.error(key_node, f"declassify: unknown key {key!r} (known: "
                                 f"{', '.join(_ALL_RULE_KEYS)})")
        for required in ("to", "when"):
            if required not in entries:
                raise self.error(node, f"declassify: a rule needs {required!r}")
        when_node = entries["when"][1]
        when = when_node.value if isinstance(when_node, yaml.ScalarNode) else None
        if when == "count":
            raise self.error(when_node, "declassify: when: count is no longer a form; use "
                             "when: aggregate (a count is an aggregate; min_rows bounds the "
                             "rows it counts)")
        if when not in FORMS:
            raise self.error(when_node, f"declassify: when must be one of {', '.join(FORMS)}")
        for key, (key_node, _) in entries.items():
            if key not in ("to", "when") and key not in _RULE_KEYS[when]:
                forms = [f for f, keys in _RULE_KEYS.items() if key in keys]
                raise self.error(key_node, f"declassify: {key} applies only to rules with "
                                 f"when: {forms[0]}, not when: {when}")
        if when == "dp" and "max_epsilon" not in entries:
            raise self.error(node, "declassify: a rule with when: dp needs max_epsilon (the "
                             "largest epsilon of one release)")
        to = self.strings(entries["to"][1], "declassify.to")
        min_rows = self.count(entries["min_rows"][1], "declassify.min_rows", 1) \
            if "min_rows" in entries else 1
        epsilon = self.positive(entries["max_epsilon"][1], "declassify.max_epsilon") \
            if "max_epsilon" in entries else None
        budget = self.positive(entries["budget"][1], "declassify.budget") \
            if "budget" in entries else None
        releases = self.count(entries["max_releases"][1], "declassify.max_releases", 1) \
            if "max_releases" in entries else None
        return DeclassifyRule(tuple(to), when, min_rows, epsilon, budget,
                              node.start_mark.line + 1, releases)
