"""A tiny Lightning DDP training (gloo, CPU) for tests/integrations: run it under torchrun with 2
processes. Rank ``--nan-rank`` computes a NaN loss at step ``--nan-step``; ModelCheckpoint saves
every 2 steps; ``--resume PATH`` resumes from that checkpoint (Lightning's ``ckpt_path``; a plain
``DataLoader``, so a resume mid-epoch starts the epoch's data again). Every rank reports through ``healthsvc_client.lightning.HealthCallback``."""
from __future__ import annotations

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from healthsvc_client.lightning import HealthCallback
from tests.integrations.torchrun import job_parser


class Tiny(L.LightningModule):
    def __init__(self, nan_step: int, nan_rank: int) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)
        self.nan_step, self.nan_rank = nan_step, nan_rank

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        if self.global_step == self.nan_step and self.global_rank == self.nan_rank:
            loss = loss * float("nan")  # this rank's fault; the all-reduce spreads it
        return loss

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=0.05)
        # Stepped every step (before on_train_batch_end): the lr sent must be the one the update used.
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1 - 0.05 * s)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}


def main() -> None:
    p = job_parser()
    p.add_argument("--ckpt-dir", required=True)
    p.add_argument("--nan-step", type=int, default=3)
    p.add_argument("--nan-rank", type=int, default=1, help="-1: no NaN")
    p.add_argument("--resume", default=None, help="checkpoint to resume from")
    args = p.parse_args()
    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
    trainer = L.Trainer(max_steps=args.steps, accelerator="cpu", devices=2, strategy="ddp", logger=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[HealthCallback(args.url, args.run_id, fingerprint_every=2),
                                   ModelCheckpoint(dirpath=args.ckpt_dir, every_n_train_steps=2, save_top_k=-1)])
    trainer.fit(Tiny(args.nan_step, args.nan_rank), torch.utils.data.DataLoader(data, batch_size=4),
                ckpt_path=args.resume)


if __name__ == "__main__":
    main()
