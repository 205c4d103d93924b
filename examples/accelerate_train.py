"""HuggingFace Accelerate on mmfeed's stream: your own loop, one micro-batch per step, DDP.

    mmfeed serve --input data.jsonl --dp 2 --global-batch 64 --micro-batches 1 --job mine &
    torchrun --nproc-per-node 2 examples/accelerate_train.py --nats nats://127.0.0.1:4222 --job mine --steps 100
    torchrun --nproc-per-node 2 examples/accelerate_train.py --nats nats://127.0.0.1:4222 --job mine --steps 100 \
        --resume out/accelerate/step_50

prepare_data (mmfeed_trainer.integrations.accelerate) gives the loop mmfeed's dataloader (not
through accelerator.prepare: each rank already has its balanced share) and registers the data
position with save_state/load_state; no skip_first_batches on resume, the data resumes itself.
"""
import argparse, os

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed

from mmfeed_trainer.data import StreamDataset, weighted_loss
from mmfeed_trainer.integrations.accelerate import prepare_data
from plain_torch import TinyClip  # any model whose forward takes the batch's keys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--nats", required=True), ap.add_argument("--job", required=True), ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--save-steps", type=int), ap.add_argument("--out", default="out/accelerate")
    ap.add_argument("--resume", help="a step_N directory")
    args = ap.parse_args()
    accelerator = Accelerator(cpu=not torch.cuda.is_available())
    set_seed(0)  # the same initial model on every run (DDP copies rank 0's to the others)
    model = TinyClip()
    model, opt = accelerator.prepare(model, torch.optim.AdamW(model.parameters(), lr=1e-3))
    ds = StreamDataset(args.nats, args.job)
    loader = prepare_data(accelerator, ds)
    done = 0
    if args.resume:
        accelerator.load_state(args.resume)
        done = int(os.path.basename(os.path.normpath(args.resume)).split("_")[-1])
    for batch in loader:
        loss = weighted_loss(model(**batch), batch["weight"])
        accelerator.backward(loss)
        opt.step(), opt.zero_grad()
        done += 1
        accelerator.print(f"step {batch['step']} loss {accelerator.reduce(loss.detach(), 'mean').item():.4f} data {ds.state_dict()}")
        if done % (args.save_steps or args.steps) == 0:
            accelerator.save_state(os.path.join(args.out, f"step_{done}"))
        if done == args.steps:
            break
    print(f"rank {accelerator.process_index}/{accelerator.num_processes} {accelerator.distributed_type.value}: trained {done} steps, data {ds.state_dict()}")
    ds.close()


if __name__ == "__main__":
    main()
