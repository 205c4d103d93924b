"""The data loading layer: everything between the wire and a host ``Batch``.

``mmfeed_trainer.data`` itself is the public dataset API of ``data.datasets``
(``StreamDataset``, ``ShardDataset``, ``weighted_loss``, ...: that module's doc), loaded on
first use so that importing one module of this layer does not import them all.

Modules: ``batches`` (Arrow record -> ``Batch``), ``layout`` (per-sample sizes on the host),
``wire`` (chunk headers, reassembly, CRC-32C), ``accept`` (which chunks a rank takes),
``jpegwire`` (JPEG rows), ``stream`` (the NATS client, a subpackage), ``natsauth``
(credentials), ``shardset`` and ``sources`` (shard files, synthetic and stream sources of
steps), ``synthetic``, ``position`` (resume position), ``prefetch`` (the prefetch thread),
``datasets`` (torch datasets for your own loop).

Imports: this layer imports no model, parallelism or loop module, except
``parallel.parallel_dims`` (the rank layout a source reads for); ``tests/test_layers.py``.
"""

_API = ("HF_KEYS", "MicroBatch", "ShardDataset", "StreamDataset", "env_rank", "global_weight", "hf_item",
        "rank_share", "state_after", "to_device", "weighted_loss", "Batch", "Position", "STATE_VERSION")


def __getattr__(name: str):
    if name in _API:
        from . import datasets
        return getattr(datasets, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_API])
