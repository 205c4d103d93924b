"""Your own PyTorch loop on mmfeed's stream: exact gradients over micro-batches and dp ranks.

    mmfeed serve --input data.jsonl --dp 2 --global-batch 64 --job mine &
    torchrun --nproc-per-node 2 examples/plain_torch.py --nats nats://127.0.0.1:4222 --job mine
"""
import argparse, os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

from mmfeed_trainer.data import StreamDataset, global_weight, rank_share


class TinyClip(nn.Module):
    def __init__(self, vocab=30522, dim=64):  # vocab: bert-base-uncased, mmfeed's default tokenizer
        super().__init__()
        self.tok, self.img = nn.Embedding(vocab, dim), nn.Sequential(nn.AdaptiveAvgPool2d(4), nn.Flatten(), nn.Linear(48, dim))

    def forward(self, input_ids, attention_mask, pixel_values, weight, **_):
        m = attention_mask.unsqueeze(-1).float()
        text = F.normalize((self.tok(input_ids) * m).sum(1) / m.sum(1).clamp_min(1), dim=-1)
        logits = F.normalize(self.img(pixel_values), dim=-1) @ text.T * 10.0
        logits = logits.masked_fill(weight[None, :] == 0, -1e4)  # padding rows are no negatives
        target = torch.arange(len(weight), device=logits.device)
        return (F.cross_entropy(logits, target, reduction="none") + F.cross_entropy(logits.T, target, reduction="none")) / 2


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--nats", required=True), ap.add_argument("--job", required=True), ap.add_argument("--steps", type=int, default=100)
    args = ap.parse_args()
    if int(os.environ.get("WORLD_SIZE", 1)) > 1:
        dist.init_process_group("gloo")  # "nccl" on GPUs
    model = TinyClip()
    ddp = nn.parallel.DistributedDataParallel(model) if dist.is_initialized() else model
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ds = StreamDataset(args.nats, args.job)  # rank and world from torchrun, layout from the service
    step, pending = 0, []
    for batch in DataLoader(ds, batch_size=None):
        pending.append(batch)
        if batch["micro_batch"] + 1 < batch["micro_batches"]:
            continue  # a step's micro-batches share one denominator: the step's weight over all dp ranks
        total = global_weight(torch.cat([b["weight"] for b in pending]))
        loss = sum(rank_share(ddp(**b), b["weight"], total) for b in pending)
        loss.backward()
        opt.step(), opt.zero_grad()
        print(f"step {batch['step']} loss {loss.item():.4f} data {ds.state_dict()}", flush=True)
        step, pending = step + 1, []
        if step == args.steps:
            break
    ds.close()


if __name__ == "__main__":
    main()
