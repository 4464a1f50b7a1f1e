"""The torchrun compatibility guard: fail closed unless the rendezvous store is exactly as registered.

Windows CPU wheels lack libuv while the c10d rendezvous asks for ``use_libuv=True``, and the
agent-shared rendezvous store broke restarts in some releases (pytorch/pytorch
#139990, #148283, #135712). The guard pins the exact source of the one function that builds the
agent's store, then replaces only that module's reference to ``TCPStore`` with a wrapper that
forces ``use_libuv=False``, binds loopback where the platform allows, and serves no other
caller. Anything unexpected raises :class:`GuardError` before torchrun starts.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import inspect
import os
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dcp_invariant import canonical, runtimes
from dcp_invariant.commit import durable
from dcp_invariant.errors import Error

ATTESTATION_ENV = "DCP_INVARIANT_GUARD_ATTESTATION"
SHARE_STORE_ENV = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"


class GuardError(Error, RuntimeError):
    """The torchrun agent cannot be guarded; it must not start."""


def install(attestation_path: str | None = None) -> dict[str, Any]:
    """Check and patch the rendezvous backend; return the attestation written once a store exists."""
    import torch
    from torch._C._distributed_c10d import TCPStore
    from torch.distributed.elastic.rendezvous import c10d_rendezvous_backend as backend

    distribution = importlib.metadata.version("torch")
    runtime = runtimes.find(distribution, str(torch.__version__), sys.platform)
    if runtime is None:
        raise GuardError(
            f"torch {distribution}/{torch.__version__} is not a registered runtime "
            f"here ({runtimes.registered_pairs(sys.platform)}); refusing to patch its rendezvous"
        )
    creator = backend._create_tcp_store
    source = inspect.getsource(creator).encode("utf-8")
    digest = hashlib.sha256(source).hexdigest()
    if (len(source), digest) != (runtime.create_tcp_store_bytes, runtime.create_tcp_store_sha256):
        raise GuardError(
            f"_create_tcp_store in torch {runtime.torch} is {len(source)} bytes with SHA-256 "
            f"{digest}, expected {runtime.create_tcp_store_bytes} bytes with "
            f"{runtime.create_tcp_store_sha256}; the guard does not know this code"
        )
    # The module's namespace as a plain mapping: TCPStore is imported there, not exported.
    namespace: dict[str, Any] = vars(backend)
    if namespace["TCPStore"] is not TCPStore:
        raise GuardError(
            "c10d_rendezvous_backend.TCPStore is not torch's own TCPStore: something patched it first"
        )
    if namespace.get("_dcp_invariant_guarded"):
        raise GuardError("the guard is already installed in this process")

    attestation: dict[str, Any] = {
        "create_tcp_store_bytes": len(source),
        "create_tcp_store_sha256": digest,
        "listen": "127.0.0.1" if sys.platform == "linux" else "torch-default",
        "shared_rendezvous_store_disabled": False,
        "stores_built": 0,
        "tcp_store_pristine": namespace["TCPStore"] is TCPStore,
        "torch_distribution": distribution,
        "torch_runtime": str(torch.__version__),
        "use_libuv": True,
    }
    namespace["TCPStore"] = _guarded_store(
        TCPStore, creator.__code__, attestation, attestation_path
    )
    namespace["_dcp_invariant_guarded"] = True
    os.environ[SHARE_STORE_ENV] = "1"
    return attestation


def _guarded_store(
    original: Any, creator_code: Any, attestation: dict[str, Any], attestation_path: str | None
) -> Callable[..., Any]:
    def guarded_tcp_store(host: str, port: int, **kwargs: Any) -> Any:
        caller = sys._getframe(1).f_code
        if caller is not creator_code:
            raise GuardError(
                f"the guarded TCPStore was called from {caller.co_name} in {caller.co_filename}; "
                "it serves _create_tcp_store only"
            )
        kwargs["use_libuv"] = False
        if kwargs.get("is_master") and attestation["listen"] == "127.0.0.1":
            # TCPStore listens on every interface by default; hand it a loopback-bound socket.
            listener = socket.create_server(("127.0.0.1", port))
            host, port = "127.0.0.1", listener.getsockname()[1]
            kwargs["master_listen_fd"] = listener.detach()
        store = original(host, port, **kwargs)
        # Recorded from the built store and the agent's environment, not from what was asked.
        attestation["use_libuv"] = bool(store.libuvBackend)
        attestation["shared_rendezvous_store_disabled"] = os.environ.get(SHARE_STORE_ENV) == "1"
        attestation["stores_built"] += 1
        if attestation_path is not None:
            durable.replace_file(Path(attestation_path), canonical.dumps(attestation))
        return store

    return guarded_tcp_store
