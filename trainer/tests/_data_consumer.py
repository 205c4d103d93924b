"""A rank of a StreamDataset consumer in its own process (test_data.py).

    python _data_consumer.py URL JOB OUT.json [--take N] [--state IN.pkl] [--crash]

Reads micro-batches through ``DataLoader(StreamDataset(...), batch_size=None)`` with RANK and
WORLD_SIZE from the environment, writes the ids it got (weight > 0, with their (epoch, step,
micro-batch)), the layout and its final ``state_dict`` to OUT.json (the state also pickled to
OUT.json.pkl). ``--take N`` stops after N items, ``--crash`` then exits without closing the
stream (an abrupt stop), ``--state`` resumes from a pickled state.
"""

import argparse
import json
import os
import pickle
import sys

from torch.utils.data import DataLoader

from mmfeed_trainer.data import StreamDataset


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("job")
    ap.add_argument("out")
    ap.add_argument("--take", type=int, default=-1)
    ap.add_argument("--state")
    ap.add_argument("--crash", action="store_true")
    args = ap.parse_args()
    ds = StreamDataset(args.url, args.job, request_timeout_s=5.0, wait_s=90.0)
    if args.state:
        with open(args.state, "rb") as f:
            ds.load_state_dict(pickle.load(f))
    rows, keys = [], set()
    loader = iter(DataLoader(ds, batch_size=None))
    for n, item in enumerate(loader):
        keys |= set(item)
        where = (item["epoch"], item["step"], item["micro_batch"])
        rows += [[*where, i] for i, w in zip(item["ids"], item["weight"].tolist()) if w > 0]
        if n + 1 == args.take:
            break
    state = ds.state_dict()
    with open(args.out + ".pkl", "wb") as f:
        pickle.dump(state, f)
    with open(args.out, "w") as f:
        json.dump({"rows": rows, "state": state, "keys": sorted(keys), "dims": [ds.stream.dims.dp, ds.stream.dims.mp],
                   "ranks": list(ds.stream.ranks), "role": ds.stream.role}, f)
    if args.crash:
        sys.stdout.flush()
        os._exit(0)  # no close: nothing of the last step is acknowledged
    ds.stream.close()


if __name__ == "__main__":
    main()
