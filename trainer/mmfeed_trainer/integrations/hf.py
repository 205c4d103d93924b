"""transformers' ``Trainer`` on an mmfeed dataset: ``MmfeedTrainer``.

    args = TrainingArguments(output_dir="out/hf", max_steps=1000, save_steps=100,
                             use_cpu=not torch.cuda.is_available(),  # DDP over gloo on CPU
                             ignore_data_skip=True)                  # mmfeed resumes the data itself
    trainer = MmfeedTrainer(model=model, args=args, train_dataset=StreamDataset(url, job))
    trainer.train(resume_from_checkpoint=path or None)

What it changes of ``Trainer``, and why:

* the dataloader is ``DataLoader(dataset, batch_size=None)``, never passed to accelerate's
  ``prepare`` (the dataset holds this rank's balanced share already; no sampler, no dispatch);
* every checkpoint (``save_model``) holds the dataset's position in ``checkpoint-N/mmfeed_data.json``
  (written by the main process; the position is the same on every rank), and ``train`` loads it
  before training: the data continues after the last trained step;
* it refuses ``ignore_data_skip=False`` (the Trainer would then skip as many batches again,
  losing them) and a run whose ranks are not one DDP world (without ``use_cpu=True`` on a
  machine without GPUs, each rank trains ``NOT_PARALLEL`` on its own), with a ValueError;
* a resume of a multi-CPU run loads: the Trainer maps the optimizer to ``args.device``, which
  accelerate names ``cpu:0``, a location ``torch.load`` does not know; this module teaches it.

The model's ``forward`` takes the item's keys and returns ``{"loss": ...}`` (``data.weighted_loss``).
"""

from __future__ import annotations

import json
import os

import torch
from torch.utils.data import DataLoader
from transformers import Trainer
from transformers.trainer_utils import get_last_checkpoint

from ._common import check_item, check_world

POSITION_FILE = "mmfeed_data.json"
"""The dataset's ``state_dict()`` in each ``checkpoint-N`` folder."""


def _restore_indexed_cpu(storage, location: str):
    """``torch.load``'s restore of the location ``cpu:N`` (a CPU storage: it stays where it is)."""
    return storage if location.startswith("cpu:") else None


torch.serialization.register_package(100, lambda _: None, _restore_indexed_cpu)


def load_position(checkpoint: str) -> dict:
    """The dataset state saved in the checkpoint folder ``checkpoint``."""
    with open(os.path.join(checkpoint, POSITION_FILE)) as f:
        return json.load(f)


class MmfeedTrainer(Trainer):
    """A ``Trainer`` whose ``train_dataset`` is an mmfeed dataset (module doc)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if not self.args.ignore_data_skip:
            raise ValueError("hf: TrainingArguments(ignore_data_skip=True): the mmfeed dataset resumes at its "
                             "saved position, the Trainer would skip as many batches again")
        check_world("hf", self.args.world_size, self.train_dataset,
                    "pass TrainingArguments(use_cpu=True) on a machine without GPUs")

    def get_train_dataloader(self) -> DataLoader:
        return DataLoader(self.train_dataset, batch_size=None)

    def training_step(self, model, inputs, num_items_in_batch=None):
        check_item("hf", inputs)
        return super().training_step(model, inputs, num_items_in_batch)

    def train(self, resume_from_checkpoint: str | bool | None = None, **kwargs):
        if resume_from_checkpoint is True:
            resume_from_checkpoint = get_last_checkpoint(self.args.output_dir) or True
        if isinstance(resume_from_checkpoint, str):
            self.train_dataset.load_state_dict(load_position(resume_from_checkpoint))
        return super().train(resume_from_checkpoint=resume_from_checkpoint, **kwargs)

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        super().save_model(output_dir, _internal_call)
        if self.args.should_save:
            path = os.path.join(output_dir or self.args.output_dir, POSITION_FILE)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(f"{path}.tmp", "w") as f:
                json.dump(self.train_dataset.state_dict(), f)
            os.replace(f"{path}.tmp", path)
