"""Training frameworks on mmfeed's datasets: one small module per framework.

Contract
--------
Inputs: a ``data.StreamDataset`` or ``data.ShardDataset`` (each rank already holds its balanced
share: no framework may shard or sample it again) of one micro-batch per optimizer step
(``mmfeed serve --micro-batches 1``). Outputs: the framework's own data-parallel run (DDP
under torchrun, gloo on CPU) whose own checkpoint carries mmfeed's data position, so that a
resume trains every sample exactly once.

* ``hf``: ``MmfeedTrainer``, a transformers ``Trainer`` (the position in ``checkpoint-N/``).
* ``lightning``: ``MmfeedDataModule`` and ``trainer_kwargs()`` (the position in the ``.ckpt``).
* ``accelerate``: ``prepare_data(accelerator, dataset)`` (the position in ``save_state``'s folder).

Each module imports its framework only when imported itself; none is imported by the package.
Ownership: the dataset stays the caller's (``close()`` it when done).
Concurrency: one process per device; the dataset is iterated in the main process.
"""
