"""HuggingFace transformers' Trainer on mmfeed's stream: one micro-batch per Trainer step, DDP.

    mmfeed serve --input data.jsonl --dp 2 --global-batch 64 --micro-batches 1 --job mine &
    torchrun --nproc-per-node 2 examples/hf_trainer.py --nats nats://127.0.0.1:4222 --job mine --steps 100
    torchrun --nproc-per-node 2 examples/hf_trainer.py --nats nats://127.0.0.1:4222 --job mine --steps 100 \
        --resume out/hf/checkpoint-50

MmfeedTrainer (mmfeed_trainer.integrations.hf) feeds the Trainer mmfeed's own dataloader (each
rank already gets its balanced share), saves the data position in every checkpoint-N folder and
resumes the data there; the loss is mmfeed's weighted_loss.
"""
import argparse

import torch
from torch import nn
from transformers import TrainingArguments, set_seed

from mmfeed_trainer.data import StreamDataset, weighted_loss
from mmfeed_trainer.integrations.hf import MmfeedTrainer
from plain_torch import TinyClip  # any model whose forward takes the batch's keys


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.clip = TinyClip()

    def forward(self, weight, **batch):  # HF Trainer reads "loss" from the output
        return {"loss": weighted_loss(self.clip(weight=weight, **batch), weight)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--nats", required=True), ap.add_argument("--job", required=True), ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--save-steps", type=int), ap.add_argument("--out", default="out/hf")
    ap.add_argument("--resume", help="a checkpoint-N directory")
    args = ap.parse_args()
    set_seed(0)  # the same initial model on every run (DDP copies rank 0's to the others)
    targs = TrainingArguments(output_dir=args.out, max_steps=args.steps, learning_rate=1e-3, logging_steps=1,
                              save_steps=args.save_steps or args.steps, report_to="none",
                              use_cpu=not torch.cuda.is_available(), ignore_data_skip=True)
    ds = StreamDataset(args.nats, args.job)
    trainer = MmfeedTrainer(model=Model(), args=targs, train_dataset=ds)
    trainer.train(resume_from_checkpoint=args.resume)
    a = trainer.args  # DISTRIBUTED: one DDP run over the torchrun world
    print(f"rank {a.process_index}/{a.world_size} {a.parallel_mode.value}: trained {trainer.state.global_step} steps, data {ds.state_dict()}")
    ds.close()


if __name__ == "__main__":
    main()
