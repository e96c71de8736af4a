"""Training FLOPs per target token, counted from the model itself, and what they cost on a given GPU.

`count_training_flops` runs one training forward + backward under `torch.utils.flop_counter.FlopCounterMode`, which
counts the matrix products that reach the dispatcher, those of the fused loss included (its backward products run
in its forward). Element-wise work (softmax, LayerNorm, dropout, Adam) is not counted, as is usual for MFU.

It runs on the CPU in float32 on a small batch: the 'meta' device cannot run the training loss, which depends on
the data (boolean indexing of the real target tokens). Attention is eager, because FlopCounterMode has no formula
for the CPU sdpa kernel; eager computes the full n x n scores, as its formula for the GPU kernels counts them.
`analytic_training_flops_per_token` is the same count from the config alone, for cross-checking.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

from vaswani_mt.model.configuration_vaswani import VaswaniConfig

# The paper's run (§5.2, Table 2): steps, ~25,000 source + 25,000 target tokens per step, wall time on 8 P100, and
# Table 2's training cost, "training time x number of GPUs x sustained single-precision TFLOPS" (footnote 5, 9.5 for
# a P100): an upper bound at 100% utilisation.
PAPER_TOKENS_PER_STEP = 25_000
PAPER_P100_TFLOPS = 9.5
PAPER_RUNS = {
    "base": {"steps": 100_000, "hours_on_8_p100": 12.0, "table2_flops": 3.3e18},
    "big": {"steps": 300_000, "hours_on_8_p100": 3.5 * 24, "table2_flops": 2.3e19},
}
# The WMT14 En-De training sentences average about 27 BPE tokens per side (an estimate: the length only moves the
# small attention term).
WMT14_MEAN_LENGTH = 27

# Dense tensor-core peaks in TFLOPS for bf16, or fp16 where a GPU has no bf16 (P100, V100), from NVIDIA's data
# sheets; the P100 has no tensor cores: its number is the fp16 peak of its CUDA cores.
GPU_PEAK_TFLOPS = {"P100": 21.2, "V100": 125.0, "A100": 312.0, "H100": 989.4}  # the SXM parts, for paper_time.py
_DEVICE_PEAKS = [  # (pattern in torch.cuda.get_device_name(), TFLOPS); the first match wins
    (r"H200 NVL", 835.0),
    (r"H200", 989.4),
    (r"H100 NVL", 835.0),
    (r"H100 PCIE", 756.0),
    (r"H100", 989.4),  # "NVIDIA H100 80GB HBM3": SXM
    (r"A100", 312.0),
    (r"L40S", 362.0),
    (r"\bL4\b", 121.0),
    (r"\bA10\b", 125.0),
    (r"V100S", 130.0),
    (r"V100[- ]PCIE", 112.0),
    (r"V100", 125.0),  # SXM2
    (r"P100[- ]PCIE", 18.7),
    (r"P100", 21.2),  # SXM2
]


def peak_tflops(device_name: str) -> float | None:
    """The dense bf16 (fp16 before Ampere) tensor peak of a CUDA device by its name, or None for an unknown one."""
    name = device_name.upper()
    for pattern, tflops in _DEVICE_PEAKS:
        if re.search(pattern, name):
            return tflops
    return None


def mfu(target_tokens_per_s: float, flops_per_target_token: float, peak_tflops_: float) -> float:
    """Model FLOPs utilisation: the useful FLOPs per second over the device's peak."""
    return target_tokens_per_s * flops_per_target_token / (peak_tflops_ * 1e12)


def as_config(config: VaswaniConfig | str, vocab_size: int = 37000) -> VaswaniConfig:
    return VaswaniConfig.from_preset(config, vocab_size=vocab_size) if isinstance(config, str) else config


@dataclass
class FlopCount:
    flops: int  # forward + backward of one batch
    target_tokens: int
    by_operator: dict[str, int]

    @property
    def per_target_token(self) -> float:
        return self.flops / self.target_tokens

    def per_step(self, target_tokens: int = PAPER_TOKENS_PER_STEP) -> float:
        return self.per_target_token * target_tokens


def count_training_flops(
    config: VaswaniConfig | str,
    source_length: int = WMT14_MEAN_LENGTH,
    target_length: int | None = None,
    batch: int = 2,
    vocab_size: int = 37000,
    seed: int = 0,
) -> FlopCount:
    """FLOPs of one training forward + backward (no optimizer step) of `batch` pairs of `source_length` and
    `target_length` tokens (every one real, none padding), counted by FlopCounterMode on the CPU in float32."""
    from torch.utils.flop_counter import FlopCounterMode

    from vaswani_mt.model.modeling_vaswani import VaswaniForConditionalGeneration

    config = as_config(config, vocab_size)
    target_length = source_length if target_length is None else target_length
    with torch.random.fork_rng(devices=[]):  # the weights come from `seed`; the caller's RNG is left as it was
        torch.manual_seed(seed)
        model = VaswaniForConditionalGeneration(config).train()
    model.set_attn_implementation("eager")  # see the module docstring
    generator = torch.Generator().manual_seed(seed)
    source = torch.randint(4, config.vocab_size, (batch, source_length), generator=generator)
    labels = torch.randint(4, config.vocab_size, (batch, target_length), generator=generator)
    source[:, -1] = labels[:, -1] = config.eos_token_id
    counter = FlopCounterMode(display=False)
    with counter:
        loss = model(input_ids=source, attention_mask=torch.ones_like(source), labels=labels).loss
        loss.backward()
    by_operator = {str(op): int(n) for op, n in counter.get_flop_counts()["Global"].items()}
    return FlopCount(flops=int(counter.get_total_flops()), target_tokens=labels.numel(), by_operator=by_operator)


def analytic_training_flops_per_token(
    config: VaswaniConfig | str,
    source_length: int = WMT14_MEAN_LENGTH,
    target_length: int | None = None,
    vocab_size: int = 37000,
) -> dict[str, float]:
    """Training FLOPs per target token from the shapes alone, in three terms (forward 2, backward 4 per multiply-add):

    - `matrices`: 6 x the parameters of every matrix product in the stacks, once per token they act on (the
      encoder's and the cross-attention key and value projections per source token, the rest per target token);
    - `output_layer`: 6 x d_model x V, the pre-softmax projection;
    - `attention`: 3 x the forward Q K^T and A V products, 2 x n x (d_k + d_v) x h per query for n keys.
    """
    c = as_config(config, vocab_size)
    target_length = source_length if target_length is None else target_length
    ratio = source_length / target_length
    query_output = c.d_model * c.num_heads * c.d_k + c.num_heads * c.d_v * c.d_model
    key_value = c.d_model * c.num_heads * (c.d_k + c.d_v)
    ffn = 2 * c.d_model * c.d_ff
    per_source_token = c.num_encoder_layers * (query_output + key_value + ffn) + c.num_decoder_layers * key_value
    per_target_token = c.num_decoder_layers * (2 * query_output + key_value + ffn)
    per_query = 2 * c.num_heads * (c.d_k + c.d_v)  # times the number of keys
    attention_forward = (
        c.num_encoder_layers * per_query * source_length * ratio  # encoder self-attention, per target token
        + c.num_decoder_layers * per_query * (target_length + source_length)  # decoder self and cross
    )
    terms = {
        "matrices": 6.0 * (per_source_token * ratio + per_target_token),
        "output_layer": 6.0 * c.d_model * c.vocab_size,
        "attention": 3.0 * attention_forward,
    }
    terms["total"] = sum(terms.values())
    return terms


def non_embedding_parameters(config: VaswaniConfig | str, vocab_size: int = 37000) -> int:
    """Parameters outside the shared embedding (and learned positions): the `N` of the usual `6 N` per token."""
    from vaswani_mt.model.modeling_vaswani import VaswaniForConditionalGeneration

    with torch.device("meta"):
        model = VaswaniForConditionalGeneration(as_config(config, vocab_size))
    embeddings = {id(p) for m in model.modules() if isinstance(m, torch.nn.Embedding) for p in m.parameters()}
    return sum(p.numel() for p in model.parameters() if id(p) not in embeddings)


__all__ = [
    "GPU_PEAK_TFLOPS",
    "PAPER_P100_TFLOPS",
    "PAPER_RUNS",
    "PAPER_TOKENS_PER_STEP",
    "WMT14_MEAN_LENGTH",
    "FlopCount",
    "analytic_training_flops_per_token",
    "count_training_flops",
    "mfu",
    "non_embedding_parameters",
    "peak_tflops",
]
