"""PyTorch Lightning on mmfeed's stream: one micro-batch per training step, DDP.

    mmfeed serve --input data.jsonl --dp 2 --global-batch 64 --micro-batches 1 --job mine &
    torchrun --nproc-per-node 2 examples/lightning_train.py --nats nats://127.0.0.1:4222 --job mine --steps 100
    torchrun --nproc-per-node 2 examples/lightning_train.py --nats nats://127.0.0.1:4222 --job mine --steps 100 \
        --resume out/lightning/step=50.ckpt

MmfeedDataModule (mmfeed_trainer.integrations.lightning) gives Lightning mmfeed's dataloader and
keeps the data position in Lightning's checkpoint; trainer_kwargs() makes the torchrun world one
DDP run (mmfeed balances the ranks itself: no distributed sampler).
"""
import argparse

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from mmfeed_trainer.data import StreamDataset, weighted_loss
from mmfeed_trainer.integrations.lightning import MmfeedDataModule, trainer_kwargs
from plain_torch import TinyClip  # any model whose forward takes the batch's keys


class Module(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.clip = TinyClip()

    def training_step(self, batch, _):
        loss = weighted_loss(self.clip(**batch), batch["weight"])
        self.log("loss", loss, prog_bar=True, batch_size=len(batch["ids"]), sync_dist=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--nats", required=True), ap.add_argument("--job", required=True), ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--save-steps", type=int), ap.add_argument("--out", default="out/lightning")
    ap.add_argument("--resume", help="a .ckpt file")
    args = ap.parse_args()
    L.seed_everything(0)  # the same initial model on every run (DDP copies rank 0's to the others)
    ckpt = ModelCheckpoint(dirpath=args.out, filename="{step}", every_n_train_steps=args.save_steps or args.steps, save_top_k=-1)
    trainer = L.Trainer(max_steps=args.steps, callbacks=[ckpt], logger=False, enable_progress_bar=False,
                        enable_model_summary=False, **trainer_kwargs())
    data = MmfeedDataModule(StreamDataset(args.nats, args.job))
    trainer.fit(Module(), datamodule=data, ckpt_path=args.resume)
    print(f"rank {trainer.global_rank}/{trainer.world_size}: trained {trainer.global_step} steps, "
          f"loss {trainer.callback_metrics['loss'].item():.4f}, data {data.position}")


if __name__ == "__main__":
    main()
