"""A party's policy: which drivers and protocols it accepts and what may leave it.

A policy is a YAML mapping; every key is optional::

    # policies/node_0.yaml: what node_0 accepts and what may leave it
    drivers: [driver]            # driver names (from the spec) accepted; absent: every driver
                                 # the spec lists
    plaintext_to: []             # parties (node names, or "driver") that may receive this
                                 # node's plaintext data, raw or derived (default: none)
    protocols: [CHEETAH, ABY3]   # secure-device protocols accepted (default: CHEETAH, ABY3,
                                 # and SEMI2K only where this node is its own dealer: the
                                 # device's first member with Beaver TrustedFirstParty)
    programs: []                 # allow-listed program digests (hex): every reveal allowed
    max_uses: {}                 # uploaded object name -> how many executions may use it
    declassify:                  # rules for revealing values derived from this node's data
      - to: [driver, node_1]     # receivers: "driver" (any accepted driver), node names, "*"
        when: aggregate          # aggregate | compare | count | any
        min_elements: 10         # aggregate/count: each revealed element combines at least
                                 # this many of this node's elements (default 1)

``when`` matches the form of the revealed value (see `mplang.policy.flows`):
``aggregate`` accepts aggregates and counts, ``count`` only counts, ``compare``
comparison results, ``any`` everything. A malformed file is a `PolicyError`
naming the file, the line and the key.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from mplang.edsl.errors import MPLangError

if TYPE_CHECKING:
    import yaml

DRIVER = "driver"
"""The receiver name standing for any driver the policy accepts."""
ANYONE = "*"
FORMS = ("aggregate", "compare", "count", "any")
"""Values of a declassification rule's ``when``."""
DEFAULT_PROTOCOLS = ("CHEETAH", "ABY3")
"""Protocols accepted by default: none of them makes one party the others' dealer."""
_DIGEST = re.compile(r"[0-9a-f]{64}")
_KEYS = ("drivers", "plaintext_to", "protocols", "programs", "max_uses", "declassify")


class PolicyError(MPLangError):
    """A policy file is malformed; the message names the file, line and key to fix."""


@dataclass(frozen=True)
class DeclassifyRule:
    """Values of ``form`` ``when`` (combining >= ``min_elements`` elements) may go to ``to``."""

    to: tuple[str, ...]
    when: str
    min_elements: int = 1
    line: int = 0

    def __str__(self) -> str:
        extra = f", min_elements: {self.min_elements}" if self.when in ("aggregate", "count") \
            else ""
        return f"declassify {{to: [{', '.join(self.to)}], when: {self.when}{extra}}}"


@dataclass(frozen=True)
class Policy:
    """One party's policy (see the module docstring for the file format)."""

    drivers: tuple[str, ...] | None = None
    plaintext_to: tuple[str, ...] = ()
    protocols: tuple[str, ...] | None = None
    programs: frozenset[str] = frozenset()
    max_uses: Mapping[str, int] = field(default_factory=dict)
    declassify: tuple[DeclassifyRule, ...] = ()
    source: str = "the default policy"

    @staticmethod
    def default() -> Policy:
        """Every driver of the spec, no plaintext recipients, no declassification, the
        default protocols."""
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
            return Policy(source=source)
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
        rules = tuple(p.rule(node) for node in p.items(entries["declassify"][1])) \
            if "declassify" in entries else ()
        return Policy(names("drivers"), names("plaintext_to") or (), names("protocols"),
                      frozenset(programs), max_uses, rules, source)

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

    def rule_for(self, receiver: str, form: str, elements: int) -> DeclassifyRule | None:
        """The first declassification rule letting ``receiver`` get a value of ``form``
        combining ``elements`` of this party's elements (None: no rule does)."""
        for rule in self.declassify:
            if receiver not in rule.to and ANYONE not in rule.to:
                continue
            if rule.when == "any" or (rule.when == "compare" and form == "compare"):
                return rule
            if rule.when in ("aggregate", "count") and elements >= rule.min_elements and (
                    form == rule.when or (rule.when == "aggregate" and form == "count")):
                return rule
        return None


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

    def count(self, node: yaml.Node, key: str, low: int) -> int:
        import yaml

        if not (isinstance(node, yaml.ScalarNode) and node.tag == "tag:yaml.org,2002:int"):
            raise self.error(node, f"{key} must be an integer")
        value = int(node.value)
        if value < low:
            raise self.error(node, f"{key} must be at least {low}, got {value}")
        return value

    def rule(self, node: yaml.Node) -> DeclassifyRule:
        import yaml

        entries = self.mapping(node, "a declassify rule")
        unknown = [k for k in entries if k not in ("to", "when", "min_elements")]
        if unknown:
            raise self.error(entries[unknown[0]][0], f"declassify: unknown key {unknown[0]!r} "
                             "(known: to, when, min_elements)")
        for required in ("to", "when"):
            if required not in entries:
                raise self.error(node, f"declassify: a rule needs {required!r}")
        when_node = entries["when"][1]
        when = when_node.value if isinstance(when_node, yaml.ScalarNode) else None
        if when not in FORMS:
            raise self.error(when_node, f"declassify: when must be one of {', '.join(FORMS)}")
        to = self.strings(entries["to"][1], "declassify.to")
        minimum = self.count(entries["min_elements"][1], "declassify.min_elements", 1) \
            if "min_elements" in entries else 1
        return DeclassifyRule(tuple(to), when, minimum, node.start_mark.line + 1)
