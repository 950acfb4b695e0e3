"""libspu links for SPU runs (and libpsi's, which take the same link context): in-memory
links within one process, and links over a worker's own communicator
(`libspu.link.IChannel`) between processes.

Over the communicator, SPU protocol messages travel like every other message
between parties: authenticated, tagged with the execution id (so aborting an
execution also releases libspu's waits), and without extra ports.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import spu
import spu.libspu as libspu

from mplang.dialects.spu import SpuConfig, runtime_config_for
from mplang.edsl.errors import MPTimeoutError
from mplang.kernels.spu.sessions import Session
from mplang.runtime import native_logs
from mplang.runtime.backend import Communicator


class SpuLinkFactory(Protocol):
    """Creates the libspu link of one member for one run of an SPU op; ``(exec_id, key)``
    is unique to that run, and a receive waits at most ``timeout_s`` (the run's)."""

    def __call__(self, config: SpuConfig, exec_id: str, key: str, member_index: int,
                 timeout_s: float) -> Any: ...


class MemLinkFactory:
    """libspu's in-memory links: all members live in this process."""

    def __call__(self, config: SpuConfig, exec_id: str, key: str, member_index: int,
                 timeout_s: float) -> Any:
        return self.link(config.members, exec_id, key, member_index, timeout_s)

    def link(self, members: Sequence[int], exec_id: str, key: str, member_index: int,
             timeout_s: float) -> Any:
        """The link of ``members[member_index]`` among the parties ``members`` (ranks)."""
        desc = link_desc(members, f"{exec_id}{key}", int(timeout_s * 1000), "mem")
        return libspu.link.create_mem(desc, member_index)


def route_logs() -> None:
    """Send libspu's and libpsi's logs to the party's log (`native_logs`); at
    ``MPLANG_LOG=debug``, lower libspu's level to debug."""
    first = not native_logs.routed()
    native_logs.route()
    if first and native_logs.level() == "debug":
        options = libspu.logging.LogOptions()
        options.log_level = libspu.logging.LogLevel.DEBUG
        libspu.logging.setup_logging(options)


def link_desc(members: Sequence[int], name: str, recv_timeout_ms: int,
              transport: str) -> Any:
    """The libspu link description of link ``name`` among the parties ``members``."""
    route_logs()
    desc = libspu.link.Desc()
    desc.id = name
    desc.recv_timeout_ms = recv_timeout_ms
    for rank in members:
        desc.add_party(f"party{rank}", f"{transport}:{rank}")
    return desc


SETTLE_POLL_S = 0.02
"""While a kept session's run has not heard every member's session state, a receive
looks for the states this often (`_CommChannel.Recv`)."""


class _CommChannel(libspu.link.IChannel):
    """One peer of one SPU link; libspu calls these (CamelCase) methods from its threads."""

    def __init__(self, communicator: Communicator, peer: int, exec_id: str, prefix: str,
                 timeout_s: float):
        super().__init__()
        self._comm = communicator
        self._peer = peer
        self._exec_id = exec_id
        self._prefix = prefix
        self._timeout_s = timeout_s
        self._attempt = ""
        self._settled: Callable[[], bool] | None = None

    def bind(self, exec_id: str, prefix: str, timeout_s: float, attempt: str = "",
             settled: Callable[[], bool] | None = None) -> None:
        """Carry the messages of another run (a kept session's link serves many), tagged
        with ``attempt`` (the session's state: an abandoned attempt's messages never
        reach another). While ``settled()`` is False (it raises when the run must be
        abandoned), receives call it every `SETTLE_POLL_S`."""
        self._exec_id, self._prefix, self._timeout_s = exec_id, prefix, timeout_s
        self._attempt, self._settled = attempt, settled

    def _tag(self, tag: str) -> tuple[str, str]:
        return (self._exec_id, f"{self._prefix}#{self._attempt}{tag}")

    def Send(self, tag: str, data: Any) -> None:
        self._comm.send(self._peer, self._tag(tag), bytes(data))

    def SendAsync(self, tag: str, data: Any) -> None:
        self.Send(tag, data)

    def SendAsyncThrottled(self, tag: str, data: Any) -> None:
        self.Send(tag, data)

    def Recv(self, tag: str) -> bytes:
        full = self._tag(tag)
        deadline = time.monotonic() + self._timeout_s
        while (settled := self._settled) is not None and \
                deadline - time.monotonic() > SETTLE_POLL_S:
            if settled():
                self._settled = None  # every state is in and matches: no more checks
                break
            try:
                return self._comm.recv(self._peer, full, SETTLE_POLL_S)
            except MPTimeoutError:
                continue
        return self._comm.recv(self._peer, full, max(0.0, deadline - time.monotonic()))

    def TestSend(self, timeout: int) -> None:
        self.Send("__test__", b"\x00")

    def TestRecv(self) -> None:
        self.Recv("__test__")

    def WaitLinkTaskFinish(self) -> None:
        pass

    def Abort(self) -> None:
        pass

    def SetThrottleWindowSize(self, size: int) -> None:
        pass

    def SetChunkParallelSendSize(self, size: int) -> None:
        pass

    def SetRecvTimeout(self, timeout_ms: int) -> None:
        """Ignored: a receive waits at most the run's timeout (libpsi's n-party protocols
        ask for 30 or 60 minutes)."""

    def GetRecvTimeout(self) -> int:
        return int(self._timeout_s * 1000)


class ChannelLinkFactory:
    """SPU links whose messages go through ``communicator`` (one per worker)."""

    def __init__(self, communicator: Communicator):
        self.communicator = communicator

    def __call__(self, config: SpuConfig, exec_id: str, key: str, member_index: int,
                 timeout_s: float) -> Any:
        return self.link(config.members, exec_id, key, member_index, timeout_s)

    def link(self, members: Sequence[int], exec_id: str, key: str, member_index: int,
             timeout_s: float) -> Any:
        """The link of ``members[member_index]`` among the parties ``members`` (ranks)."""
        return self._link(members, f"{exec_id}{key}", member_index, exec_id, key,
                          timeout_s)[0]

    def session(self, config: SpuConfig, name: str, member_index: int, exec_id: str,
                key: str, timeout_s: float) -> Session:
        """A kept session (`mplang.kernels.spu.sessions`): a runtime on a link named
        ``name`` whose messages go to the run it is bound to, first this one."""
        link, channels = self._link(config.members, name, member_index, exec_id, key,
                                    timeout_s)

        def bind(exec_id: str, key: str, timeout_s: float, attempt: str,
                 settled: Callable[[], bool] | None) -> None:
            for channel in channels:
                channel.bind(exec_id, f"{key}/link", timeout_s, attempt, settled)

        return Session(spu.Runtime(link, runtime_config_for(config)), bind)

    def _link(self, members: Sequence[int], name: str, member_index: int, exec_id: str,
              key: str, timeout_s: float) -> tuple[Any, list[_CommChannel]]:
        desc = link_desc(members, name, int(timeout_s * 1000), "channel")
        channels = {i: _CommChannel(self.communicator, rank, exec_id, f"{key}/link", timeout_s)
                    for i, rank in enumerate(members) if i != member_index}
        link = libspu.link.create_with_channels(
            desc, member_index, [channels.get(i) for i in range(len(members))])
        return link, list(channels.values())
