"""Peak memory of the training loss over the vocabulary (issue 64): the compiled step's loss in chunks, against the
same loss in one chunk and against the plain log-softmax the compiled step used before; eager's fused loss beside.

    python benchmarks/loss_memory.py --rows 24000 --vocab 37000 --d_model 512 --json OUT.json
    python benchmarks/loss_memory.py --rows 2000 --vocab 8000 --backend aot_eager   # a quick check

Each side: the loss and its gradients (hidden states and the pre-softmax matrix) from one call, after a first call
that compiles; the peak is the most bytes torch's CPU allocator held at once during the call (torch.profiler's
memory events), beyond what was allocated before it; on a GPU (`--device cuda`, benchmarks/gpu_check.sh), the
caching allocator's peak beyond what was allocated before, and the median milliseconds of 5 calls. Memory, not time:
fine on a loaded machine. `--padding` of the rows are labelled -100 (a padded batch); float32, or the matrix products
in bf16 with `--bf16` (autocast).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

import vaswani_mt.model.fast_paths_vaswani as fast_paths


def peak_bytes(call, device: str = "cpu") -> int:
    """The most bytes torch's allocator (of the CPU, or a CUDA device) held at once while `call()` ran, beyond those
    held before it."""
    if device != "cpu":
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        call()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - before
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        call()
    # every allocation and free (bytes negative) of the CPU allocator, raw: the profiler's own tables fold those made
    # inside an op into the op's net usage
    events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events()
                    if e.name() == "[memory]" and e.device_type() == DeviceType.CPU)  # fmt: skip
    level = peak = 0
    for _, nbytes in events:
        level += nbytes
        peak = max(peak, level)
    return peak


def plain_loss(hidden, weight, labels, eps: float, scale):
    """What the compiled step computed before issue 64's chunks: the logits of every position, then the log-softmax
    and the cross-entropy over them (the model's `loss`)."""
    logits = F.linear(hidden, weight).float()
    return F.cross_entropy(logits, labels, ignore_index=-100, reduction="sum", label_smoothing=eps) * scale


def fused_eager_loss(hidden, weight, labels, eps: float, scale):
    """The eager training path: the real tokens only, in chunks of at most 2^26 logits."""
    real = labels.ne(-100)
    return fast_paths.projected_label_smoothed_cross_entropy(hidden[real], weight, labels[real], eps, float(scale))


def inputs(rows: int, vocab: int, d_model: int, padding: float, seed: int = 0, device: str = "cpu"):
    generator = torch.Generator().manual_seed(seed)
    hidden = torch.randn(rows, d_model, generator=generator)
    weight = torch.randn(vocab, d_model, generator=generator) * d_model**-0.5
    labels = torch.randint(4, vocab, (rows,), generator=generator)
    labels[torch.rand(rows, generator=generator) < padding] = -100
    scale = 1.0 / labels.ne(-100).sum().float()
    hidden, weight = hidden.to(device).requires_grad_(), weight.to(device).requires_grad_()
    return hidden, weight, labels.to(device), scale.to(device)


def side_peaks(args) -> dict:
    eps = 0.1
    sides = {
        "compiled_chunked": (fast_paths.chunked_label_smoothed_cross_entropy, True, None),
        "compiled_one_chunk": (fast_paths.chunked_label_smoothed_cross_entropy, True, 1),
        "compiled_plain_before": (plain_loss, True, None),
        "eager_fused": (fused_eager_loss, False, None),
    }
    hidden, weight, labels, scale = inputs(args.rows, args.vocab, args.d_model, args.padding, device=args.device)
    default_rows = fast_paths._COMPILED_LOSS_ROWS
    result = {}
    for name, (function, compiled, chunks) in sides.items():
        torch._dynamo.reset()
        # one chunk: a row budget that no vocabulary splits
        fast_paths._COMPILED_LOSS_ROWS = 1 if chunks == 1 else default_rows
        run = torch.compile(function, backend=args.backend, dynamic=True) if compiled else function

        def step(run=run):
            hidden.grad = weight.grad = None
            with torch.autocast(hidden.device.type, dtype=torch.bfloat16, enabled=args.bf16):
                loss = run(hidden, weight, labels, eps, scale)
            loss.backward()
            return loss

        loss = step()  # compiles
        result[name] = {
            "peak_mib": round(peak_bytes(step, args.device) / 2**20, 1),
            "loss": round(float(loss.detach()), 6),
        }
        if args.device != "cpu":  # a quiet GPU's time; a CPU shared with others gives none worth keeping
            times = []
            for _ in range(5):
                torch.cuda.synchronize()
                start = time.perf_counter()
                step()
                torch.cuda.synchronize()
                times.append(time.perf_counter() - start)
            result[name]["median_ms"] = round(1000 * statistics.median(times), 2)
        print(name, result[name], flush=True)
    fast_paths._COMPILED_LOSS_ROWS = default_rows
    return result


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=24000, help="target positions of the batch (the 1-GPU recipe's)")
    parser.add_argument("--vocab", type=int, default=37000, help="V (§5.1's 37,000 shared BPE)")
    parser.add_argument("--d_model", type=int, default=512)
    parser.add_argument("--padding", type=float, default=0.1, help="share of the rows labelled -100")
    parser.add_argument("--backend", default="inductor", help="torch.compile backend of the compiled sides")
    parser.add_argument("--bf16", action="store_true", help="under bf16 autocast")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--json", help="also write the result here")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    sides = side_peaks(args)
    whole = args.rows * args.vocab * 4
    chunks = max(1, -(-args.vocab * fast_paths._COMPILED_LOSS_ROWS // fast_paths._LOSS_CHUNK_ELEMENTS))
    result = {
        "shape": f"{args.rows} rows x {args.vocab} vocabulary, d_model {args.d_model}, {args.padding:.0%} padding, "
        + ("bf16 autocast" if args.bf16 else "float32"),
        "backend": args.backend,
        "device": torch.cuda.get_device_name() if args.device != "cpu" else "cpu",
        "compiled_chunks": chunks,
        "float32_logits_of_the_batch_mib": round(whole / 2**20, 1),
        "sides": sides,
        "torch": torch.__version__,
    }
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
