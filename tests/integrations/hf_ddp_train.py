"""A tiny ``transformers.Trainer`` DDP training (gloo, CPU) for tests/integrations: run it under
torchrun with 2 processes. A randomly initialised one-layer GPT-2 (no download) on 64 random
sequences, 4 per device, so an epoch is 8 steps; a checkpoint every 2 steps. ``--resume DIR``
resumes from that ``checkpoint-N`` directory; with ``--ignore-data-skip`` the Trainer starts the
epoch's data again instead of skipping the batches already trained on. Every rank reports through
``healthsvc_client.hf.attach``."""
from __future__ import annotations

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

from healthsvc_client.hf import attach
from tests.integrations.torchrun import job_parser


def main() -> None:
    p = job_parser()
    p.add_argument("--out", required=True)
    p.add_argument("--resume", default=None)
    p.add_argument("--ignore-data-skip", action="store_true")
    args = p.parse_args()
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=1, n_head=2))
    ids = torch.randint(0, 64, (64, 16), generator=torch.Generator().manual_seed(1))
    dataset = [{"input_ids": row, "labels": row} for row in ids]
    targs = TrainingArguments(output_dir=args.out, max_steps=args.steps, per_device_train_batch_size=4,
                              learning_rate=1e-3, report_to=[], use_cpu=True, logging_steps=100,
                              save_strategy="steps", save_steps=2, disable_tqdm=True, dataloader_num_workers=0,
                              ignore_data_skip=args.ignore_data_skip)
    trainer = Trainer(model=model, args=targs, train_dataset=dataset)
    attach(trainer, args.url, run_id=args.run_id, heartbeat_interval_s=0, fingerprint_every=2)
    trainer.train(resume_from_checkpoint=args.resume)


if __name__ == "__main__":
    main()
