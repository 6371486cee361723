"""What the multi-process training tests share: a free port for the process group, and
FSDP2 sharding as they shard (each Linear a unit, then the whole model). The rank scripts
import it as ``training.ranks`` (their path holds tests/), the test modules as
``tests.training.ranks``."""

from __future__ import annotations

import socket
from typing import Any


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def fsdp2(model: Any) -> Any:
    """``model`` sharded over the two ranks' CPU mesh by FSDP2's ``fully_shard``."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (2,))
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    return fully_shard(model, mesh=mesh)
