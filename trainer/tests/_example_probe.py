"""Runs an example script (``python _example_probe.py examples/x.py args...``, under torchrun)
with the examples' ``TinyClip`` observed, for test_examples.py:

* every training forward appends ``{"rank", "step", "ids", "loss"}`` (the real rows: weight > 0)
  to ``$MMFEED_PROBE_OUT/trained-<rank>.jsonl``;
* at exit, ``$MMFEED_PROBE_OUT/params-<rank>.json`` holds a digest of the last TinyClip's
  parameters.
"""
import atexit
import hashlib
import json
import os
import runpy
import sys

import plain_torch

OUT = os.environ["MMFEED_PROBE_OUT"]
RANK = int(os.environ.get("RANK", 0))
_init, _forward = plain_torch.TinyClip.__init__, plain_torch.TinyClip.forward
models = []


def init(self, *args, **kwargs):
    _init(self, *args, **kwargs)
    models.append(self)


def forward(self, input_ids, attention_mask, pixel_values, weight, **batch):
    out = _forward(self, input_ids, attention_mask, pixel_values, weight, **batch)
    if self.training:
        real = [i for i, w in enumerate(weight.tolist()) if w > 0]
        rec = {"rank": RANK, "step": batch["step"], "ids": [batch["ids"][i] for i in real],
               "loss": [out[i].item() for i in real]}
        with open(os.path.join(OUT, f"trained-{RANK}.jsonl"), "a") as f:
            f.write(json.dumps(rec) + "\n")
    return out


@atexit.register
def digest():
    if models:
        h = hashlib.sha256()
        for name, p in models[-1].state_dict().items():
            h.update(name.encode() + p.detach().cpu().contiguous().numpy().tobytes())
        with open(os.path.join(OUT, f"params-{RANK}.json"), "w") as f:
            json.dump(h.hexdigest(), f)


plain_torch.TinyClip.__init__, plain_torch.TinyClip.forward = init, forward
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
