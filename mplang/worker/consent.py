"""The worker's side of the signed accept: program framing, votes and their checks.

``/run`` carries the committed program followed by this party's openings (header
field ``program_bytes`` says where the program ends). A party that accepts a run
of several parties sends each other party its vote: its node key's signature over
the execution, scope, execution digest, spec digest and the run's parties
(`vote_message`). Each worker checks all the others' votes before any op runs: a
driver that sent different programs, or different lists of parties, to different
parties cannot produce votes that match.
"""

from __future__ import annotations

from collections.abc import Mapping
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
"""Header field: the length of the program part of a ``/run`` body."""


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
              spec_digest: str, parties: frozenset[int]) -> str:
    """This node's vote (base64 signature) accepting the execution, run by ``parties``."""
    return encode_vote(identity.sign(vote_message(exec_id, scope, digest, spec_digest,
                                                  parties)))


class VoteRefusal(MPRefusedError):
    """A run's votes do not show that every other party accepted the program this party
    accepted: the run is refused before any op runs."""


def check_votes(votes: Mapping[str, Any], peers: PeerDirectory, rank: int,
                parties: frozenset[int], exec_id: str, scope: str, digest: str) -> None:
    """Check that every other party of the run accepted the program this party accepted
    (``digest``) with the same ``parties``: its vote (``votes``, by rank as text) is a
    signature over them by that party's node certificate. Raises `VoteRefusal` (409)
    naming the first party whose vote is wrong."""
    message = vote_message(exec_id, scope, digest, peers.digest, parties)
    for party in sorted(parties - {rank}):
        signature = decode_vote(votes.get(str(party)))
        if signature is None or not peers.node_certificate(party).verify(signature, message):
            raise VoteRefusal(f"party {rank}: the vote of party {party} for execution "
                              f"{exec_id} is not a signature over this program (execution "
                              f"digest {digest[:16]}...) and parties {sorted(parties)} by "
                              f"party {party}'s certificate: the parties were given "
                              "different programs or parties, or the vote was forged", 409)
