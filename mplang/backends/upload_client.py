"""``mplang put``: a node's owner uploads a tensor to its own worker, with the node's own
key, for programs to read with ``simp.load``. The driver never sees the data."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from mplang.backends.mux_client import MuxClients, StatusError, TransportError
from mplang.backends.wire import encode_value, pack_message
from mplang.cluster.identity import load_identity
from mplang.device.cluster import ClusterSpec
from mplang.edsl.errors import MPLangError, MPRefusedError
from mplang.storage.named_objects import check_name


def read_npy(path: str | os.PathLike[str]) -> np.ndarray:
    """The array in ``.npy`` file ``path``, read without pickle."""
    if Path(path).suffix != ".npy":
        raise MPLangError(f"{path}: mplang put uploads .npy files")
    try:
        return np.asarray(np.load(path, allow_pickle=False))
    except (ValueError, OSError) as e:
        raise MPLangError(f"{path}: not a readable .npy array without pickle: {e}") from None


def put(spec_path: str | os.PathLike[str], node: str, name: str, value: Any, *,
        key: str | os.PathLike[str] | None = None, timeout: float = 60.0) -> dict[str, Any]:
    """Upload tensor ``value`` as ``name`` to ``node``'s worker, presenting ``node``'s own
    key (default ``keys/<node>.key`` next to the spec); returns the worker's answer
    (``name``, ``node``, ``dtype``, ``shape``)."""
    check_name(name, "mplang put")
    cluster = ClusterSpec.from_yaml(spec_path)
    rank = cluster.rank_of(node)
    key_path = key or Path(spec_path).resolve().parent / "keys" / f"{node}.key"
    clients = MuxClients(cluster, load_identity(key_path), timeout)
    try:
        response = clients.post(rank, "/upload",
                                pack_message({"name": name}, encode_value(np.asarray(value))))
    except StatusError as e:
        refused = MPRefusedError(f"{node} refused the upload: {e.response.status_code} "
                                 f"{e.response.text[:500]}", e.response.status_code)
        refused.party = rank
        raise refused from None
    except TransportError as e:
        raise MPLangError(f"{node} could not be reached: {type(e).__name__}: {e}") from None
    finally:
        clients.close()
    if response.status_code != 200:
        raise MPLangError(f"{node} failed to store the upload: {response.status_code} "
                          f"{response.text[:500]}")
    answer: dict[str, Any] = response.json()
    return answer
