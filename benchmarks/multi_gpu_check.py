"""gpu_check.sh's multi-GPU step, one process per GPU under `accelerate launch`:

    accelerate launch --multi_gpu --num_processes N benchmarks/multi_gpu_check.py --mode ddp --json OUT.json
    accelerate launch --use_fsdp --fsdp_version 2 --num_processes N benchmarks/multi_gpu_check.py --mode fsdp ...

- `ddp`: NCCL data parallel on every visible GPU (gloo on CPU processes with --cpu, gpu_check.sh's dry run): the
  model of --preset trained --steps steps on random pairs of --length tokens, --batch pairs per GPU, bf16 autocast,
  fused AdamW; records target tokens/s per GPU (median step) and whether the weights are bit-for-bit equal on every
  rank afterwards (a SHA-256 of each rank's parameters, gathered).
- `fsdp`: whether the model's three-way tied matrix (source embedding, target embedding, pre-softmax projection,
  §3.4) survives FSDP in the installed accelerate: one training step under the FSDP plugin the launcher set, then
  whether the three are still one parameter. FSDP2 refused shared parameters before accelerate PR #4171; the
  answer, or the error, is recorded.

Rank 0 writes the record to --json.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import time
from pathlib import Path

import accelerate
import torch
from accelerate import Accelerator
from accelerate.utils import gather_object

from vaswani_mt import VaswaniConfig, VaswaniForConditionalGeneration


def _batch(config: VaswaniConfig, batch: int, length: int, device, seed: int) -> dict:
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(4, config.vocab_size, (2, batch, length), generator=generator)
    return {"input_ids": ids[0].to(device), "labels": ids[1].to(device)}


def _tied(model) -> bool:
    """Whether the source embedding, the target embedding and the pre-softmax projection are still one matrix."""
    matrices = [model.model.encoder.embed_tokens.weight, model.model.decoder.embed_tokens.weight,
                model.get_output_embeddings().weight, model.get_input_embeddings().weight]  # fmt: skip
    return len({matrix.data_ptr() for matrix in matrices}) == 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=["ddp", "fsdp"], required=True)
    parser.add_argument("--preset", default="base")
    parser.add_argument("--vocab_size", type=int, default=37000)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--length", type=int, default=30)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--cpu", action="store_true", help="CPU processes (gloo): the dry run of gpu_check.sh")
    parser.add_argument("--json", required=True)
    args = parser.parse_args()

    accelerator = Accelerator(cpu=args.cpu, mixed_precision="no" if args.cpu else "bf16")
    config = VaswaniConfig.from_preset(args.preset, vocab_size=args.vocab_size)
    torch.manual_seed(0)
    model = VaswaniForConditionalGeneration(config)
    record: dict = {
        "mode": args.mode,
        "processes": accelerator.num_processes,
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() and not args.cpu else "cpu",
        "backend": str(torch.distributed.get_backend()) if torch.distributed.is_initialized() else None,
        "accelerate": accelerate.__version__,
        "torch": torch.__version__,
        "shape": {"preset": args.preset, "batch_per_process": args.batch, "length": args.length},
    }
    try:
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9,
                                      fused=not args.cpu)  # fmt: skip
        model, optimizer = accelerator.prepare(model, optimizer)
        times = []
        for step in range(args.steps if args.mode == "ddp" else 1):
            batch = _batch(
                config, args.batch, args.length, accelerator.device, seed=1000 * step + accelerator.process_index
            )
            if accelerator.device.type == "cuda":
                torch.cuda.synchronize()
            started = time.perf_counter()
            loss = model(**batch).loss
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if accelerator.device.type == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - started)
        unwrapped = accelerator.unwrap_model(model)
        if args.mode == "ddp":
            warm = times[min(3, len(times) - 1) :]
            record["target_tokens_per_s_per_process"] = round(args.batch * args.length / statistics.median(warm), 1)
            digest = hashlib.sha256()
            for name, parameter in sorted(unwrapped.state_dict().items()):
                digest.update(name.encode())
                digest.update(parameter.detach().float().cpu().numpy().tobytes())
            digests = gather_object([digest.hexdigest()])
            record["weights_equal_on_every_rank"] = len(set(digests)) == 1
        else:
            record["fsdp_step"] = "ok"
            record["tied_after_fsdp"] = _tied(unwrapped)
    except Exception as error:  # the answer to record (FSDP refusing the tied matrix, say), not a crash
        record["error"] = f"{type(error).__name__}: {' '.join(str(error).split())[:400]}"
    if accelerator.is_main_process:
        Path(args.json).write_text(json.dumps(record, indent=2) + "\n")
        print(json.dumps(record))
    accelerator.wait_for_everyone()
    accelerator.end_training()


if __name__ == "__main__":
    main()
