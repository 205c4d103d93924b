"""PyTorch Lightning on an mmfeed dataset: ``MmfeedDataModule`` and ``trainer_kwargs()``.

    trainer = L.Trainer(max_steps=1000, **trainer_kwargs())    # DDP over the torchrun world
    trainer.fit(module, datamodule=MmfeedDataModule(StreamDataset(url, job)), ckpt_path=path or None)

* ``trainer_kwargs()``: the world torchrun started, spelled out for Lightning (on CPU it
  otherwise picks one device and ``SingleDeviceStrategy`` on every rank: the ranks train apart),
  and ``use_distributed_sampler=False`` (each rank holds its balanced share already).
* ``MmfeedDataModule``: the dataloader, and the data position in Lightning's own checkpoint
  (``checkpoint["MmfeedDataModule"]["position"]``, restored by Lightning before training).
  Lightning fetches one batch ahead of training, so the saved position is the one after the last
  batch handed to ``training_step`` (``on_before_batch_transfer``), not the dataset's.
"""

from __future__ import annotations

import os

import lightning as L
import torch
from torch.utils.data import DataLoader

from ._common import check_item, check_world


def trainer_kwargs() -> dict:
    """``L.Trainer`` arguments for the torchrun world (one process per device): accelerator,
    devices (``LOCAL_WORLD_SIZE``), num_nodes, ``strategy="ddp"`` when the world has several
    ranks, and ``use_distributed_sampler=False``."""
    world = int(os.environ.get("WORLD_SIZE", 1))
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    return {"accelerator": "gpu" if torch.cuda.is_available() else "cpu", "devices": local,
            "num_nodes": world // local, "strategy": "ddp" if world > 1 else "auto",
            "use_distributed_sampler": False}


class MmfeedDataModule(L.LightningDataModule):
    """The training data of an mmfeed dataset (module doc); ``close()``s it at teardown."""

    def __init__(self, dataset):
        super().__init__()
        self.dataset = dataset
        self.position = dataset.state_dict()
        """Where a resume continues: after the last batch handed to training."""

    def setup(self, stage: str) -> None:
        check_world("lightning", self.trainer.world_size, self.dataset, "pass L.Trainer(**trainer_kwargs())")

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.dataset, batch_size=None)

    def on_before_batch_transfer(self, batch, dataloader_idx: int):
        if self.trainer.training:
            check_item("lightning", batch)
            self.position = self.dataset.state_after(batch)
        return batch

    def state_dict(self) -> dict:
        return {"position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.position = state["position"]
        self.dataset.load_state_dict(self.position)

    def teardown(self, stage: str) -> None:
        if hasattr(self.dataset, "close"):
            self.dataset.close()
