"""A LightningModule around any torch module, for the training tests: the loss is the
squared output's mean of each batch's first tensor, the optimizer SGD (lr 0.05 unless
given)."""

from __future__ import annotations

from typing import Any


def module(net: Any, **sgd: Any) -> Any:
    import lightning.pytorch as L
    import torch

    class Wrapped(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = net

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            return self.net(batch[0]).pow(2).mean()

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), **{"lr": 0.05, **sgd})

    return Wrapped()
