"""``mplang put``: a node's owner uploads a tensor to its own worker, with the node's own
key, for programs to read with ``simp.load``. The driver never sees the data.
``mplang budget``: the owner reads its worker's privacy budget ledger the same way."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from mplang.cluster.identity import load_identity
from mplang.device.cluster import ClusterSpec
from mplang.edsl.errors import MPLangError, MPRefusedError
from mplang.storage.named_objects import check_name
from mplang.transport.mux_client import MuxClients, StatusError, TransportError
from mplang.transport.wire import encode_value, pack_message


def read_npy(path: str | os.PathLike[str]) -> np.ndarray:
    """The array in ``.npy`` file ``path``, read without pickle."""
    if Path(path).suffix != ".npy":
        raise MPLangError(f"{path}: mplang put uploads .npy files")
    try:
        return np.asarray(np.load(path, allow_pickle=False))
    except (ValueError, OSError) as e:
        raise MPLangError(f"{path}: not a readable .npy array without pickle: {e}") from None


def _ask(spec_path: str | os.PathLike[str], node: str, key: str | os.PathLike[str] | None,
         timeout: float, path: str, header: dict[str, Any], payload: Any, what: str) -> Any:
    """POST ``path`` to ``node``'s worker presenting ``node``'s own key (default
    ``keys/<node>.key`` next to the spec); its JSON answer."""
    cluster = ClusterSpec.from_yaml(spec_path)
    rank = cluster.rank_of(node)
    key_path = key or Path(spec_path).resolve().parent / "keys" / f"{node}.key"
    clients = MuxClients(cluster, load_identity(key_path), timeout)
    try:
        response = clients.post(rank, path, pack_message(header, payload))
    except StatusError as e:
        refused = MPRefusedError(f"{node} refused {what}: {e.response.status_code} "
                                 f"{e.response.text[:500]}", e.response.status_code)
        refused.party = rank
        raise refused from None
    except TransportError as e:
        raise MPLangError(f"{node} could not be reached: {type(e).__name__}: {e}") from None
    finally:
        clients.close()
    if response.status_code != 200:
        raise MPLangError(f"{node} failed {what}: {response.status_code} "
                          f"{response.text[:500]}")
    return response.json()


def budget(spec_path: str | os.PathLike[str], node: str, *,
           key: str | os.PathLike[str] | None = None, timeout: float = 60.0) -> dict[str, Any]:
    """``node``'s privacy budget ledger (`mplang.policy.ledger.Ledger.report` and its
    ``node``), asked of its worker with ``node``'s own key."""
    answer: dict[str, Any] = _ask(spec_path, node, key, timeout, "/budget", {},
                                  encode_value(np.zeros(0, np.uint8)), "the budget request")
    return answer


def put(spec_path: str | os.PathLike[str], node: str, name: str, value: Any, *,
        key: str | os.PathLike[str] | None = None, timeout: float = 60.0) -> dict[str, Any]:
    """Upload tensor ``value`` as ``name`` to ``node``'s worker, presenting ``node``'s own
    key (default ``keys/<node>.key`` next to the spec); returns the worker's answer
    (``name``, ``node``, ``dtype``, ``shape``)."""
    check_name(name, "mplang put")
    answer: dict[str, Any] = _ask(spec_path, node, key, timeout, "/upload", {"name": name},
                                  encode_value(np.asarray(value)), "the upload")
    return answer
