"""mmfeed_trainer: the bundled PyTorch trainer of mmfeed.

Contract
--------
Inputs: micro-batches in the Arrow schema of docs/protocol.md, one record batch per
(step, dp rank, micro-batch), from the NATS stream (``stream.py``), from ``mmfeed shard``
files (``sources.py``) or generated (``synthetic.py``); ``data.py`` wraps them as torch
datasets for your own training loop.
Outputs: a trained image-text model (ITC + ITM, ``model.py``), checkpoints (model,
optimizer, scheduler, stream position: ``checkpoint.py``) and per-step feedback (compute
time, data-wait time) to the service.
Ownership: a rank owns the tensors it converts; records are not retained after
conversion; checkpoints are written by dp rank 0 of each mp rank.
Concurrency: one process per device (torchrun); inside a process, one prefetch thread
produces host batches, the main thread trains.

Modules: ``config`` (sizes, optimiser), ``model`` (plain single-device model), ``docmask``
(FlexAttention document masks of packed samples),
``parallel_dims`` (mesh layout), ``parallelize`` (mp split + DDP/FSDP2), ``exchange``
(differentiable p2p between mp ranks), ``losses``, ``step`` (one training step), ``optim``,
``timing`` (rank-local compute time; the step passes its clock explicitly), ``batches``
(Arrow -> torch), ``position`` (typed resume position), ``sources`` (shards, synthetic), ``wire`` (chunk headers, reassembly, CRC-32C), ``stream`` (NATS client),
``data`` (``StreamDataset``, ``ShardDataset``, ``weighted_loss``),
``prefetch`` (the one prefetch thread, also under ``stream.Stream``), ``checkpoint``, ``synthetic``, ``train`` (the loop), ``__main__`` (CLI).
``integrations`` (HF ``Trainer``, Lightning, Accelerate on ``data``'s datasets: one module each, importing
its framework only when imported itself).
"""

__version__ = "0.1.0"
