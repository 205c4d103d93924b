"""Pipeline parallelism (``--pp > 1``): ``stage`` (each tower's blocks split over stages, the
1F1B / GPipe schedule, the pipelined step) and ``link`` (point-to-point messages that carry
each micro-batch's shapes). The pipelined loop is ``loop.train_pp``, its checkpoints
``loop.pp_checkpoint``."""
