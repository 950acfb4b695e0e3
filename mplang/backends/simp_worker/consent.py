"""The worker's side of the two-phase accept: program framing, votes and their checks.

``/prepare`` carries the committed program followed by this party's openings
(header field ``program_bytes`` says where the program ends). A party that
accepts answers with its vote: its node key's signature over the execution,
scope, execution digest and spec digest (`vote_message`). ``/run`` carries
every participant's vote, and each worker checks all the others' before any
op runs: a driver that sent different programs to different parties cannot
produce votes that match.
"""

from __future__ import annotations

from typing import Any

from mplang.cluster.commitments import (
    Openings,
    decode_openings,
    decode_vote,
    encode_vote,
    vote_message,
)
from mplang.cluster.identity import LocalIdentity
from mplang.cluster.peers import PeerDirectory
from mplang.edsl.errors import MPRefusedError, MPSerializationError

PROGRAM_BYTES = "program_bytes"
"""Header field: the length of the program part of a ``/prepare`` or ``/run`` body."""


def split_program(header: dict[str, Any], payload: memoryview) -> tuple[memoryview, Openings]:
    """The committed program's bytes and this party's openings from a request body."""
    size = header.get(PROGRAM_BYTES)
    if size is None:
        return payload, {}
    if type(size) is not int or not 0 < size <= len(payload):
        raise MPSerializationError(f"field {PROGRAM_BYTES!r} must be the program's length "
                                   f"(1 to {len(payload)} bytes)")
    return payload[:size], decode_openings(payload[size:])


def sign_vote(identity: LocalIdentity, exec_id: str, scope: str, digest: str,
              spec_digest: str) -> str:
    """This node's vote (base64 signature) accepting the execution."""
    return encode_vote(identity.sign(vote_message(exec_id, scope, digest, spec_digest)))


def check_votes(votes: Any, peers: PeerDirectory, rank: int, parties: frozenset[int],
                exec_id: str, scope: str, digest: str) -> None:
    """Check that every other party of the run accepted the program this party accepted
    (``digest``): a valid vote, signed by that party's node certificate. Raises
    `MPRefusedError` (409) naming the first party whose vote is missing or wrong."""
    if not isinstance(votes, dict):
        raise MPRefusedError(f"party {rank}: execution {exec_id} (scope {scope!r}) came "
                             "without the other parties' votes: every party must accept "
                             "the program before any runs it", 409)
    message = vote_message(exec_id, scope, digest, peers.digest)
    for party in sorted(parties - {rank}):
        signature = decode_vote(votes.get(str(party)))
        if signature is None:
            raise MPRefusedError(f"party {rank}: no vote of party {party} for execution "
                                 f"{exec_id}: every party must accept the program before "
                                 "any runs it", 409)
        if not peers.node_certificate(party).verify(signature, message):
            raise MPRefusedError(f"party {rank}: the vote of party {party} for execution "
                                 f"{exec_id} is not a signature over this program (execution "
                                 f"digest {digest[:16]}...) by party {party}'s certificate: "
                                 "the parties were given different programs, or the vote "
                                 "was forged", 409)
