"""A rank of a StreamDataset consumer in its own process (test_data.py).

    python _data_consumer.py URL JOB OUT.json [--take N] [--state IN.pkl] [--crash]

Reads micro-batches through ``DataLoader(StreamDataset(...), batch_size=None)`` with RANK and
WORLD_SIZE from the environment, writes the ids it got (weight > 0, with their (epoch, step,
micro-batch)), the item keys and its final ``state_dict`` to OUT.json (the state also pickled to
OUT.json.pkl). ``--take N`` stops after N items, ``--crash`` then exits without closing the
stream (an abrupt stop), ``--state`` resumes from a pickled state.
"""

import argparse
import json
import os
import pickle
import sys

from torch.utils.data import DataLoader

from mmfeed_trainer.data.datasets import StreamDataset


def consume(url, job, *, take=-1, state=None, rank=None, world_size=None):
    """Read up to ``take`` items (-1: all); returns (result dict, dataset)."""
    ds = StreamDataset(url, job, rank=rank, world_size=world_size, request_timeout_s=5.0, wait_s=90.0)
    if state is not None:
        ds.load_state_dict(state)
    rows, keys = [], set()
    for n, item in enumerate(DataLoader(ds, batch_size=None)):
        keys |= set(item)
        where = (item["epoch"], item["step"], item["micro_batch"])
        rows += [[*where, i] for i, w in zip(item["ids"], item["weight"].tolist()) if w > 0]
        if n + 1 == take:
            break
    return {"rows": rows, "state": ds.state_dict(), "keys": sorted(keys)}, ds


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("job")
    ap.add_argument("out")
    ap.add_argument("--take", type=int, default=-1)
    ap.add_argument("--state")
    ap.add_argument("--crash", action="store_true")
    args = ap.parse_args()
    state = None
    if args.state:
        with open(args.state, "rb") as f:
            state = pickle.load(f)
    res, ds = consume(args.url, args.job, take=args.take, state=state)
    with open(args.out + ".pkl", "wb") as f:
        pickle.dump(res["state"], f)
    with open(args.out, "w") as f:
        json.dump(res, f)
    if args.crash:
        sys.stdout.flush()
        os._exit(0)  # no close: nothing of the last step is acknowledged
    ds.stream.close()


if __name__ == "__main__":
    main()
