"""Policies: what each party accepts and what of its data may leave it.

`Policy` (the policy file), `check` (a party's verdict on a program, from the
static data-flow analysis of `mplang.flows.engine`), `Guard` (enforcement in a
worker: verdicts, labels of stored objects, fetch checks).
"""

from mplang.flows.labels import Flow
from mplang.policy.check import Guard, LabelTable, PolicyRefusedError, Verdict, check
from mplang.policy.policy import DeclassifyRule, Policy, PolicyError

__all__ = ["DeclassifyRule", "Flow", "Guard", "LabelTable", "Policy", "PolicyError",
           "PolicyRefusedError", "Verdict", "check"]
