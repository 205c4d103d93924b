"""mmfeed_trainer: the bundled PyTorch trainer of mmfeed.

Contract
--------
Inputs: micro-batches in the Arrow schema of docs/protocol.md, one record batch per
(step, dp rank, micro-batch), from the NATS stream (``data.stream``), from ``mmfeed shard``
files (``data.sources``) or generated (``data.synthetic``); ``data.datasets`` wraps them as
torch datasets for your own training loop.
Outputs: a trained image-text model (ITC + ITM, ``models.model``), checkpoints (model,
optimizer, scheduler, stream position: ``loop.checkpoint``) and per-step feedback (compute
time, data-wait time) to the service.
Ownership: a rank owns the tensors it converts; records are not retained after
conversion; checkpoints are written by dp rank 0 of each mp rank.
Concurrency: one process per device (torchrun); inside a process, one prefetch thread
produces host batches, the main thread trains.

Layout (docs/trainer.md, "Layout"): four layers, each importing only the ones before it --
``data`` (loading: ``batches`` Arrow -> torch, ``wire``, ``stream`` the NATS client,
``shardset`` / ``sources``, ``prefetch``, ``position``, ``synthetic``; ``mmfeed_trainer.data``
itself exports ``StreamDataset``, ``ShardDataset``, ``weighted_loss``), ``models`` (``model``,
``config``, ``losses``, ``docmask``, ``pretrained``), ``parallel`` (``parallel_dims``,
``parallelize``, ``exchange``, ``optim``, ``step``, and ``pp`` for pipeline parallelism) and
``loop`` (``train``, ``train_pp``, ``common``, ``checkpoint``, ``pp_checkpoint``) -- with
``keys`` (the names shared with the Go service), ``timing`` and ``__main__`` (CLI) on top.
``integrations`` (HF ``Trainer``, Lightning, Accelerate on ``data``'s datasets: one module each,
importing its framework only when imported itself). The old flat paths used outside the
package (``stream``, ``shardset``, ``sources``, ``train``, ...) are aliases of the moved modules.
"""

__version__ = "0.1.0"
