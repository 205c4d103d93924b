"""HuggingFace Accelerate on an mmfeed dataset: ``prepare_data(accelerator, dataset)``.

    accelerator = Accelerator(cpu=not torch.cuda.is_available())   # DDP over gloo on CPU
    model, optimizer = accelerator.prepare(model, optimizer)        # not the dataloader
    loader = prepare_data(accelerator, StreamDataset(url, job))
    if resume:
        accelerator.load_state(resume)                              # model, optimizer, data position
    for batch in loader:
        ...
        accelerator.save_state(f"out/step_{n}")

* The dataloader is ``DataLoader(dataset, batch_size=None)`` and must not go through
  ``accelerator.prepare`` (which would shard or dispatch this rank's share again), nor through
  ``skip_first_batches`` on resume: the dataset continues at its saved position itself.
* The dataset is registered with ``accelerator.register_for_checkpointing``: ``save_state``
  writes its position (``custom_checkpoint_0.pkl`` when it is the first registered object)
  beside the model, and ``load_state`` restores it before the next iteration. No prefetch: the
  position saved after a step's ``optimizer.step()`` is the one after that step.
* ValueError when the accelerator's world is not torchrun's (``Accelerator()`` without
  ``cpu=True`` on a machine without GPUs runs every rank on its own) or an item's step has
  several micro-batches.
"""

from __future__ import annotations

from collections.abc import Iterator

from accelerate import Accelerator
from torch.utils.data import DataLoader

from ._common import check_item, check_world


class _Checked(DataLoader):
    def __iter__(self) -> Iterator[dict]:
        for item in super().__iter__():
            check_item("accelerate", item)
            yield item


def prepare_data(accelerator: Accelerator, dataset) -> DataLoader:
    """The dataloader of ``dataset`` for an Accelerate loop, its position registered for
    ``save_state``/``load_state`` (module doc)."""
    check_world("accelerate", accelerator.num_processes, dataset,
                "pass Accelerator(cpu=True) on a machine without GPUs")
    accelerator.register_for_checkpointing(dataset)
    return _Checked(dataset, batch_size=None)
