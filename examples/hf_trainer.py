"""HuggingFace transformers' Trainer on mmfeed's stream: one micro-batch per Trainer step.

    mmfeed serve --input data.jsonl --dp 2 --global-batch 64 --micro-batches 1 --job mine &
    torchrun --nproc-per-node 2 examples/hf_trainer.py --nats nats://127.0.0.1:4222 --job mine

The dataloader is mmfeed's own (each rank already gets its balanced share: no sampler, no
sharding by accelerate); the loss is mmfeed's weighted_loss; the data position is saved
beside every checkpoint (mmfeed_data.json) and restored from it.
"""
import argparse, json, os

from torch import nn
from torch.utils.data import DataLoader
from transformers import Trainer, TrainerCallback, TrainingArguments

from mmfeed_trainer.data import StreamDataset, weighted_loss
from plain_torch import TinyClip  # any model whose forward takes the batch's keys


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.clip = TinyClip()

    def forward(self, weight, **batch):  # HF Trainer reads "loss" from the output
        return {"loss": weighted_loss(self.clip(weight=weight, **batch), weight)}


class MmfeedTrainer(Trainer):
    def get_train_dataloader(self):
        return DataLoader(self.train_dataset, batch_size=None)


class SaveDataPosition(TrainerCallback):
    def __init__(self, ds):
        self.ds = ds

    def on_save(self, args, state, control, **kw):
        with open(os.path.join(args.output_dir, f"checkpoint-{state.global_step}", "mmfeed_data.json"), "w") as f:
            json.dump(self.ds.state_dict(), f)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--nats", required=True), ap.add_argument("--job", required=True), ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--out", default="out/hf"), ap.add_argument("--resume", help="a checkpoint-N directory")
    args = ap.parse_args()
    ds = StreamDataset(args.nats, args.job)
    if args.resume:
        ds.load_state_dict(json.load(open(os.path.join(args.resume, "mmfeed_data.json"))))
    targs = TrainingArguments(output_dir=args.out, max_steps=args.steps, learning_rate=1e-3, logging_steps=1,
                              save_steps=args.steps, report_to="none")
    trainer = MmfeedTrainer(model=Model(), args=targs, train_dataset=ds, callbacks=[SaveDataPosition(ds)])
    trainer.train(resume_from_checkpoint=args.resume)
    ds.close()


if __name__ == "__main__":
    main()
