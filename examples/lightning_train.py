"""PyTorch Lightning on mmfeed's stream: one micro-batch per training step.

    mmfeed serve --input data.jsonl --dp 2 --global-batch 64 --micro-batches 1 --job mine &
    torchrun --nproc-per-node 2 examples/lightning_train.py --nats nats://127.0.0.1:4222 --job mine

mmfeed balances the ranks itself: use_distributed_sampler=False. The data position travels in
Lightning's checkpoint: the position after the last *trained* batch (Lightning fetches one ahead).
"""
import argparse

import lightning as L
import torch
from torch.utils.data import DataLoader

from mmfeed_trainer.data import StreamDataset, weighted_loss
from plain_torch import TinyClip  # any model whose forward takes the batch's keys


class Module(L.LightningModule):
    def __init__(self, ds):
        super().__init__()
        self.clip, self.ds, self.data_state = TinyClip(), ds, ds.state_dict()

    def training_step(self, batch, _):
        loss = weighted_loss(self.clip(**batch), batch["weight"])
        self.log("loss", loss, prog_bar=True, batch_size=len(batch["ids"]))
        self.data_state = self.ds.state_after(batch)
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)

    def train_dataloader(self):
        return DataLoader(self.ds, batch_size=None)

    def on_save_checkpoint(self, checkpoint):
        checkpoint["mmfeed_data"] = self.data_state

    def on_load_checkpoint(self, checkpoint):
        self.ds.load_state_dict(checkpoint["mmfeed_data"])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--nats", required=True), ap.add_argument("--job", required=True), ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--out", default="out/lightning"), ap.add_argument("--resume", help="a .ckpt file")
    args = ap.parse_args()
    ds = StreamDataset(args.nats, args.job)
    trainer = L.Trainer(max_steps=args.steps, use_distributed_sampler=False, default_root_dir=args.out,
                        log_every_n_steps=1, enable_progress_bar=False, enable_model_summary=False)
    module = Module(ds)
    trainer.fit(module, ckpt_path=args.resume)
    print(f"trained {trainer.global_step} steps, loss {trainer.callback_metrics['loss'].item():.4f}, data {module.data_state}")
    ds.close()


if __name__ == "__main__":
    main()
