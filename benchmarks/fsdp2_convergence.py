"""A patched tiny Llama trained with FSDP2 (fully_shard) reaches the losses of one GPU.

  torchrun --nproc_per_node=2 benchmarks/fsdp2_convergence.py [--steps 20] [--out DIR]

Every rank builds the same model from one seed and trains on the same global batch: rank r
takes rows r::world of it, so the sharded run and the single-GPU reference (computed on rank 0
by an unsharded copy, full batch) see the same data and, with mean-reduced losses, the same
gradients. Rank 0 prints both loss curves and the largest relative difference, writes
fsdp2_losses.csv to --out and exits non-zero when a step differs by more than --tol.
Needs liger-aot artifacts for the GPUs (LIGER_AOT_ARTIFACT_DIR or an arch wheel).
"""
from __future__ import annotations

import argparse
import copy
import csv
import os
import sys

import torch
import torch.distributed as dist

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def build_model(seed: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    from liger_aot.transformers.monkey_patch import apply_liger_kernel

    config = LlamaConfig(hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                         num_attention_heads=8, num_key_value_heads=4, vocab_size=4000,
                         max_position_embeddings=512, rms_norm_eps=1e-6)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    apply_liger_kernel("llama", model=model)
    return model


def batches(steps: int, batch: int, seq: int, vocab: int, device):
    """Counting sequences from random starts: learnable, so the loss curve falls."""
    g = torch.Generator().manual_seed(1234)
    for _ in range(steps):
        starts = torch.randint(0, vocab, (batch, 1), generator=g)
        yield ((starts + torch.arange(seq)) % vocab).to(device)


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=8, help="global batch (rows)")
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--tol", type=float, default=2e-3, help="max relative loss difference")
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    args = parser.parse_args()

    from torch.distributed.fsdp import fully_shard

    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(rank)
    device = torch.device("cuda", rank)
    if args.batch % world:
        sys.exit(f"--batch {args.batch} must be a multiple of the world size {world}")

    model = build_model(seed=0).to(device)
    reference = copy.deepcopy(model) if rank == 0 else None
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    model.train()
    optim = torch.optim.AdamW(model.parameters(), lr=1e-3)
    if reference is not None:
        reference.train()
        ref_optim = torch.optim.AdamW(reference.parameters(), lr=1e-3)

    sharded_losses, reference_losses = [], []
    for ids in batches(args.steps, args.batch, args.seq, model.config.vocab_size, device):
        local = ids[rank::world]
        loss = model(input_ids=local, labels=local).loss
        loss.backward()
        optim.step()
        optim.zero_grad(set_to_none=True)
        global_loss = loss.detach().clone()
        dist.all_reduce(global_loss)
        sharded_losses.append(global_loss.item() / world)
        if reference is not None:
            # The mean over `world` equal-sized shards equals the full-batch mean only when
            # each shard has the same number of labelled tokens: true here (no padding).
            ref_loss = torch.stack([reference(input_ids=ids[r::world], labels=ids[r::world]).loss
                                    for r in range(world)]).mean()
            ref_loss.backward()
            ref_optim.step()
            ref_optim.zero_grad(set_to_none=True)
            reference_losses.append(ref_loss.item())

    if rank == 0:
        worst = max(abs(a - b) / abs(b) for a, b in zip(sharded_losses, reference_losses))
        print(f"{'step':>4} {'fsdp2 x' + str(world):>12} {'1 GPU':>12}")
        for i, (a, b) in enumerate(zip(sharded_losses, reference_losses)):
            print(f"{i:>4} {a:>12.6f} {b:>12.6f}")
        print(f"largest relative loss difference: {worst:.2e} (tolerance {args.tol:.0e})")
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "fsdp2_losses.csv"), "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["step", "fsdp2", "single_gpu"])
            for i, (a, b) in enumerate(zip(sharded_losses, reference_losses)):
                w.writerow([i, f"{a:.6f}", f"{b:.6f}"])
        status = 0 if worst <= args.tol else 1
    else:
        status = 0
    dist.destroy_process_group()
    sys.exit(status)


if __name__ == "__main__":
    main()
