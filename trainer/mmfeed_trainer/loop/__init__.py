"""The training loop layer: ``train`` (the loop), ``train_pp`` (the loop under pipeline
parallelism, which ``train.run`` hands over to), ``common`` (what both loops share),
``checkpoint`` and ``pp_checkpoint``. Imports every lower layer; none imports it."""
