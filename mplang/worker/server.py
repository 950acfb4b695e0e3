"""`WorkerServer`: the state of one party's worker and what its requests do.

It ties together the parts a worker is made of: the peer directory of its
cluster spec (who is asking), the executions it takes part in and their
messages (`Inbox`, `PeerCommunicator`), the programs it accepted (`Programs`),
the parties' votes on them (`mplang.worker.consent`, `VoteBox`),
the values leaving it (`Outputs`), its spec and policy files (`SpecFile`,
`PolicyFile`) and its audit log.
The HTTP routes (`mplang.worker.http`) only read requests and call it.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mplang.cluster.identity import LocalIdentity
from mplang.cluster.peers import Peer, PeerDirectory, Role
from mplang.device.cluster import ClusterSpec, ClusterSpecError
from mplang.edsl.errors import MPLangError, MPRefusedError, MPSerializationError
from mplang.edsl.graph import Graph
from mplang.policy.enforce import driver_names, worker_policy
from mplang.policy.ledger import LEDGER_FILE, Ledger, default_state_dir
from mplang.records.audit import AuditLog
from mplang.runtime.object_store import ObjectStore
from mplang.runtime.timeline import monitoring
from mplang.transport.admission import InflightBudget
from mplang.transport.limits import WorkerLimits
from mplang.transport.mux import ALPN
from mplang.transport.mux_client import SPEC_HEADER, MuxClients
from mplang.transport.request import (
    ID,
    KEY_LIMIT,
    check_exec_id,
    inline_limit,
    program_name,
    require_str,
    run_options,
    str_or_none_list,
)
from mplang.transport.tls import ServerTrust, peer_of
from mplang.worker.consent import check_votes, sign_vote, split_program
from mplang.worker.executions import Executions
from mplang.worker.mailbox import Mailbox
from mplang.worker.messages import H_EXEC, H_KEY, Inbox, PeerCommunicator
from mplang.worker.outputs import Outputs
from mplang.worker.prepared import Prepared
from mplang.worker.programs import Programs, program_digest
from mplang.worker.spec_reload import SpecFile
from mplang.worker.state import SimpWorker
from mplang.worker.votes import VoteBox

if TYPE_CHECKING:  # the HTTP layer brings the web framework in
    from starlette.requests import Request

log = logging.getLogger("mplang.worker")


def _refused_digest(header: dict[str, Any], payload: memoryview) -> str:
    """The digest of a refused request's program (of its whole payload if malformed)."""
    try:
        program, _ = split_program(header, payload)
    except MPLangError:
        program = payload
    return program_digest(program)


class WorkerServer:
    """The state behind one worker's HTTP app."""

    def __init__(self, cluster: ClusterSpec, node: str, identity: LocalIdentity, *,
                 timeout: float = 60.0, limits: WorkerLimits | None = None,
                 spec_path: str | Path | None = None, audit_log: str | Path | None = None,
                 data_root: str | Path | None = None, policy: str | Path | None = None,
                 state_dir: str | Path | None = None):
        self.peers = PeerDirectory(cluster)
        self.rank = cluster.rank_of(node)
        if identity.fingerprint != self.peers.node_certificate(self.rank).fingerprint:
            raise ClusterSpecError(f"the key given for {node} does not belong to the "
                                   f"certificate the spec lists for {node}")
        self.node = node
        self.identity = identity
        self.limits = limits or WorkerLimits()
        self.timeout = timeout
        self.spec_file = SpecFile(spec_path) if spec_path else None
        self.trust = ServerTrust(identity.server_context, self.peers.certificates(),
                                 [ALPN, "http/1.1"])
        """Who may complete the TLS handshake, and the open connections."""
        self.mailbox = Mailbox(self.rank, self.limits.mailbox_bytes)
        self.inflight = InflightBudget(self.limits.max_inflight_bytes)
        """Bytes of bodies being received over all connections (`authorize_head`)."""
        self.executions = Executions(self.rank, self.limits)
        self.audit = AuditLog(audit_log, node, [n.name for n in cluster.nodes])
        """This node's audit log (recording nothing when ``audit_log`` is not given)."""
        self.inbox = Inbox(self.executions, self.mailbox, self.audit)
        self.communicator = PeerCommunicator(self.rank, lambda: self._clients, self.mailbox,
                                             timeout, self.executions, self.audit)
        self.votes = VoteBox(self.rank)
        """The votes peers sent for runs of several parties."""
        self._clients = MuxClients(cluster, identity, timeout, self.refused)
        self.worker = SimpWorker(self.rank, cluster.world_size, self.communicator,
                                 ObjectStore(node), timeout=timeout, in_process=False,
                                 node=node, data_root=data_root)
        self.worker.guard, self.policy_file = worker_policy(cluster, node, policy, spec_path)
        """The policy file the guard's policy comes from, watched (`reload_policy`)."""
        self.worker.guard.ledger = Ledger(Path(state_dir or default_state_dir(node))
                                          / LEDGER_FILE)
        self.worker.guard.audit = self.audit.write
        self.programs = Programs(cluster.world_size, self.worker.kernels,
                                 self.limits.max_body_bytes)
        self.outputs = Outputs(self.worker, self.audit)
        self.pool = ThreadPoolExecutor(max_workers=256, thread_name_prefix=f"mplang-{node}")

    @property
    def cluster(self) -> ClusterSpec:
        return self.peers.spec

    def peer(self, request: Request, role: Role) -> Peer:
        """The party whose certificate opened this connection, if it may act as ``role``."""
        return self.peers.authorize(peer_of(request.scope), request.headers.get(SPEC_HEADER),
                                    role, request.url.path, self.node)

    # -- programs
    def prepare(self, header: dict[str, Any], payload: memoryview, driver: Peer) -> Prepared:
        """Accept a run: decode and check its program, register it for its messages. The
        audit log records this party's verdict and, if the run it accepted cannot start
        here (aborted before it came, a reused id, over the limits), its end."""
        accepted: Graph | None = None
        try:
            exec_id = check_exec_id(header.get("exec"))
            scope = require_str(header, "scope", KEY_LIMIT)
            inputs = str_or_none_list(header.get("inputs"), "inputs")
            parties = header.get("parties", [self.rank])
            world = self.cluster.world_size
            if not isinstance(parties, list) or not parties or self.rank not in parties or \
                    not all(type(p) is int and 0 <= p < world for p in parties):
                raise MPSerializationError(f"field 'parties' must list party ranks including "
                                           f"{self.rank}")
            program, openings = split_program(header, payload)
            graph, digest = self.programs.get(program)
            if len(inputs) != len(graph.inputs):
                raise MPSerializationError("the number of inputs does not match the graph")
            options = run_options(header, exec_id)
            accepted = self.worker.accept(graph, openings, driver.certificate.fingerprint,
                                          whole=options.whole)
            guard = self.worker.guard
            verdict = guard.verdict(accepted) if guard else None
            self.audit.execution(exec_id, scope, digest, driver.audit_id, "accepted",
                                 graph=accepted, name=options.name,
                                 rule=guard.policy.source if guard else "no policy",
                                 releases=verdict.releases if verdict else None)
            run = self.executions.begin(exec_id, scope, driver.certificate.fingerprint,
                                        digest, accepted, frozenset(parties), options.timeout)
        except Exception as e:
            if accepted is not None:  # this party accepted it; it never starts here
                self.worker.refund(accepted)
                self.audit.end(exec_id, scope, str(e))
            elif isinstance(e, MPLangError):
                given, where = header.get("exec"), header.get("scope")
                self.audit.execution(
                    given if isinstance(given, str) and ID.fullmatch(given) else "",
                    where[:KEY_LIMIT] if isinstance(where, str) else "",
                    _refused_digest(header, payload), driver.audit_id, "refused", str(e),
                    name=program_name(header))
            raise
        return Prepared(run, accepted, inputs, options, inline_limit(header))

    # -- consent
    def accept(self, header: dict[str, Any], payload: memoryview, driver: Peer) -> Prepared:
        """`prepare`; a run of several parties then sends this node's vote to the others
        (`send_vote`)."""
        prepared = self.prepare(header, payload, driver)
        if len(prepared.run.parties) > 1:
            self.send_vote(prepared)
        return prepared

    def send_vote(self, prepared: Prepared) -> None:
        """Send this node's signed acceptance of a prepared run (`sign_vote`) to every
        other party of it."""
        run = prepared.run
        vote = sign_vote(self.identity, run.exec_id, run.scope, run.program,
                         self.peers.digest, run.parties).encode()
        headers = {H_EXEC: run.exec_id, H_KEY: run.scope}
        for party in sorted(run.parties - {self.rank}):
            self._clients.send(party, "/vote", [vote], headers)

    def await_votes(self, prepared: Prepared) -> None:
        """Before a prepared run of several parties starts: every other party must have
        accepted the same program (`check_votes`) within the vote limit; if not,
        the run ends here, refused (or abandoned) before any op runs."""
        run = prepared.run
        wait = max(0.0, min(run.deadline - time.monotonic(), self.timeout,
                            self.limits.vote_seconds))
        try:
            votes = self.votes.take(
                run.exec_id, run.scope, run.parties - {self.rank}, time.monotonic() + wait,
                lambda party: f"party {party} was not asked to run it, or did not accept it "
                              f"within {round(wait, 1):g} s")  # 2, not 1.99
            check_votes(votes, self.peers, self.rank, run.parties, run.exec_id, run.scope,
                        run.program)
        except MPLangError as e:
            self.worker.refund(prepared.graph)
            self.executions.end(run)
            self.mailbox.drop(run.exec_id, run.scope)
            self.audit.end(run.exec_id, run.scope, str(e),
                           refused=isinstance(e, MPRefusedError))
            raise

    def refused(self, rank: int, answer: dict[str, Any], body: memoryview) -> None:
        """Party ``rank`` refused a message or vote of this party (or it could not be
        sent): its execution is abandoned here."""
        self.communicator.refused(rank, answer, body)
        exec_id = answer.get("exec")
        if isinstance(exec_id, str):
            self.votes.abort(exec_id, f"party {rank} refused it: {answer.get('status')} "
                                      f"{str(answer.get('error'))[:500]}")

    def start(self, prepared: Prepared, driver: Peer) -> list[str | None]:
        """Run a prepared run to its end, after the other parties' votes if it has
        several; the URIs of its outputs here."""
        if len(prepared.run.parties) > 1:
            self.await_votes(prepared)
        return self.execute(prepared, driver)

    # -- runs
    def execute(self, prepared: Prepared, driver: Peer) -> list[str | None]:
        """Run a prepared run to its end; the URIs of its outputs here."""
        run = prepared.run
        options = prepared.options
        details: list[str] = []  # the full text of its failures, for the audit log only
        try:
            with contextlib.ExitStack() as stack:
                if options.monitor is not None:  # concurrent runs of one execution share one
                    shared = stack.enter_context(monitoring(run.exec_id, options.monitor))
                    options = replace(options, monitor=shared)
                outputs = self.worker.run(prepared.graph, prepared.inputs, run.exec_id,
                                          run.scope, options,
                                          owner=driver.certificate.fingerprint,
                                          on_failure=details.append)
                if options.monitor is not None:
                    prepared.events = options.monitor.drain()
        except Exception as e:
            self.audit.end(run.exec_id, run.scope,
                           details[0] if details else f"{type(e).__name__}: {e}")
            raise
        finally:
            self.executions.end(run)
            self.mailbox.drop(run.exec_id, run.scope)
        self.audit.end(run.exec_id, run.scope)
        return outputs

    def abort(self, exec_id: str, driver: Peer, reason: str) -> None:
        """End execution ``exec_id`` of ``driver`` here: its runs, prepared or going on,
        stop and wait no longer for messages."""
        self.executions.abort(exec_id, driver.certificate.fingerprint)
        self.audit.abort(exec_id, driver.audit_id, reason)
        self.votes.abort(exec_id, reason)
        self.mailbox.abort(exec_id, reason)

    def delete(self, uris: list[str], driver: Peer) -> int:
        """Delete ``driver``'s stored objects ``uris``; how many existed."""
        deleted = sum(self.worker.delete(uri, driver.certificate.fingerprint) for uri in uris)
        self.audit.delete(driver.audit_id, uris, deleted)
        return deleted

    # -- spec reload
    def reload_if_changed(self) -> bool:
        """Reload the spec file if it changed (`SpecFile`); whether it reloaded. The new
        spec's certificates are the only ones trusted from then on, by the TLS handshake
        of new connections and the clients to the peers; open connections of the others
        are closed; the guard knows the new drivers by name. A spec that needs a restart
        is refused, and a driver that sends it is told so (`PeerDirectory.refused_reload`)."""
        if self.spec_file is None:
            return False
        try:
            peers = self.spec_file.changed_peers(self.peers, self.rank,
                                                 self.identity.fingerprint)
        except MPLangError as e:
            log.error("not reloading %s: %s", self.spec_file.path, e)
            self.peers.refused_reload = f"{self.node} did not reload {self.spec_file.path}: {e}"
            return False
        if peers is None:
            return False
        if self.worker.guard is not None:
            self.worker.guard.drivers = driver_names(peers.spec)
        old_clients, self._clients = self._clients, MuxClients(
            peers.spec, self.identity, self.timeout, self.refused)
        self.peers = peers
        self.worker.states.spec_changed()
        closed = self.trust.trust_only(peers.certificates())
        old_clients.close()
        log.warning("reloaded %s (spec %s...; %d connections of removed certificates "
                    "closed)", self.spec_file.path, peers.digest[:16], closed)
        return True

    def reload_policy(self) -> bool:
        """Give the guard the policy file's new policy if it changed (`PolicyFile`), for
        the programs vetted from then on; whether it did. An edit that does not load keeps
        the policy in force; the log and ``/health`` say why."""
        file, guard = self.policy_file, self.worker.guard
        if file is None or guard is None:
            return False
        try:
            policy = file.reload()
        except MPLangError as e:
            log.error("keeping the policy in force (%s): %s", file.state()["policy"], e)
            return False
        if policy is not None:
            guard.policy = policy
            log.warning("reloaded policy %s", file.state()["policy"])
        return policy is not None

    def watch_spec(self, stop: threading.Event, interval: float = 0.5) -> None:
        """Every ``interval``: reload the spec and the policy file if they changed."""
        while not stop.wait(interval):
            self.reload_if_changed()
            self.reload_policy()

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.worker.scheduler.shutdown()
        self._clients.close()
        self.audit.close()
