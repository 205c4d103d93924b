"""The parallelism layer: the mesh layout (``parallel_dims``), the mp split and DDP/FSDP2
applied from outside the model (``parallelize``, ``exchange``, ``blockwrap``), the optimizer
and gradient clipping over the parallelized module (``optim``), one hybrid DP x MP step
(``step``), and pipeline parallelism (``pp``). Imports the model and data layers, never the
loop."""
