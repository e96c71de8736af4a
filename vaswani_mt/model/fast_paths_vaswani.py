"""The speed paths of modeling_vaswani.py: what the paper's plain operations compute, computed faster.

- `apply_dropout`: `nn.functional.dropout`, with a keep mask drawn by `torch.rand` on a CPU (`_CpuDropout`).
- `_project`: `linear(states)`, in CPU float32 and bf16 inference through a weight reordered once for oneDNN.
- `projected_label_smoothed_cross_entropy`: the pre-softmax projection and the label-smoothed cross-entropy in one
  pass over chunks of rows, without keeping the logits; `chunked_label_smoothed_cross_entropy`, the same as
  torch.compile traces it (a fixed number of chunks, so one graph for every batch shape).

Private torch functions are feature-checked once, with the public operation as fallback. Self-contained (torch
only), so that `save_pretrained` copies it as Hub remote code.
"""

from __future__ import annotations

import weakref

import torch
from torch import nn


class _CpuDropout(torch.autograd.Function):
    """Dropout whose keep mask comes from `torch.rand` (float32, then `>= p`) instead of `bernoulli_`.

    Same distribution as `nn.functional.dropout` (each element kept with probability 1 - p and scaled by
    1 / (1 - p)), but faster on a CPU, above all under bf16 (benchmarks/RESULTS.md, the dropout mask). The mask is
    saved as one byte per element for the backward pass.
    """

    @staticmethod
    def forward(ctx, hidden_states: torch.Tensor, p: float) -> torch.Tensor:
        keep = torch.rand(hidden_states.shape, device=hidden_states.device) >= p
        ctx.save_for_backward(keep)
        ctx.scale = 1.0 / (1.0 - p)
        return hidden_states.mul(keep).mul_(ctx.scale)

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor) -> tuple[torch.Tensor, None]:
        (keep,) = ctx.saved_tensors
        return grad_output.mul(keep).mul_(ctx.scale), None


def apply_dropout(hidden_states: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """`nn.functional.dropout`, with a faster mask on CPU (`_CpuDropout`); other devices use torch's own kernel."""
    if not training or p == 0.0:
        return hidden_states
    if hidden_states.device.type != "cpu" or not 0.0 < p < 1.0:
        return nn.functional.dropout(hidden_states, p=p, training=True)
    return _CpuDropout.apply(hidden_states, p)


# oneDNN's prepacked linear, the ops torch's own compiler calls for frozen CPU weights: one reorders a weight once
# into oneDNN's blocked layout, the other multiplies any number of rows by it. A build without both: F.linear.
_ONEDNN_LINEAR_OPS = ("_reorder_linear_weight", "_linear_pointwise")


def _has_onednn_linear(ops=None) -> bool:
    """Whether this torch can reorder a weight once for oneDNN and multiply by it (`ops`: the namespace of both,
    torch.ops.mkldnn)."""
    if not torch.backends.mkldnn.is_available():
        return False
    ops = torch.ops.mkldnn if ops is None else ops
    try:
        return all(callable(getattr(ops, name, None)) for name in _ONEDNN_LINEAR_OPS)
    except RuntimeError:  # a torch.ops namespace raises for an op it does not have
        return False


_ONEDNN_LINEAR = _has_onednn_linear()


def _has_native_onednn_bf16() -> bool:
    """Whether oneDNN multiplies bf16 natively on this CPU (AVX512-BF16, AMX); elsewhere it would emulate it."""
    try:
        return _ONEDNN_LINEAR and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


# The dtypes `_project` prepacks: float32, and bf16 where the CPU multiplies it (the bfloat16 compute type).
_PREPACKED_DTYPES = (torch.float32, torch.bfloat16) if _has_native_onednn_bf16() else (torch.float32,)
# Reordered weights live here, not on the modules: they are opaque tensors that cannot be copied or saved. One copy a
# weight serves every row count, so sentences leaving the search reorder nothing, and a product's result depends on
# its shapes alone, never on the calls before it (a resumed or sharded run writes the uninterrupted run's bytes). MKL's
# packed GEMM, before it, packed one copy per row count (RESULTS 2026-11-29, float32 through oneDNN).
_REORDERED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _project(linear: nn.Linear, states: torch.Tensor) -> torch.Tensor:
    """`linear(states)`, in CPU float32 (and native bf16) inference through a copy of the weight reordered once for
    oneDNN.

    An ordinary product lays the weight out again at every call, which for decoding's few rows costs more than the
    arithmetic (benchmarks/RESULTS.md, speed). The copy is made again when the weight changes. Equal to
    `linear(states)` up to the order of the sums (float32 round-off); training, torch.compile, other dtypes and
    devices, and hooked layers take `linear(states)`.
    """
    if not (
        _ONEDNN_LINEAR
        and states.numel()
        and not torch.is_grad_enabled()
        and not torch.compiler.is_compiling()  # inductor plans its own products
        and states.device.type == "cpu"
        and type(linear) is nn.Linear  # first: other layers (int8's) may have no `weight` tensor
        and states.dtype == linear.weight.dtype
        and states.dtype in _PREPACKED_DTYPES
        and not (linear._forward_hooks or linear._forward_pre_hooks or "forward" in linear.__dict__)
    ):
        # back to training after generating: drop the stale copy (not while compiling: a weak dictionary's size can
        # change between dynamo's passes over the code; a stale copy is never used, its key naming the weight's version)
        if not torch.compiler.is_compiling() and linear.training and _REORDERED:
            _REORDERED.pop(linear, None)
        return linear(states)
    weight = linear.weight
    key = (id(weight), weight.data_ptr(), weight._version, tuple(weight.shape), weight.dtype)
    entry = _REORDERED.get(linear)
    if entry is None or entry[0] != key:
        entry = _REORDERED[linear] = (key, torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None))
    bias = None if linear.bias is None else linear.bias.detach()
    return torch.ops.mkldnn._linear_pointwise(states, entry[1], bias, "none", [], "")


# Vocabulary-sized work of the training loss is done in chunks of at most this many logits (256 MB in float32).
_LOSS_CHUNK_ELEMENTS = 2**26
# log_softmax into its own input: torch's `out=` form is private; without it, the public in-place one (one more pass).
_LOG_SOFTMAX_OUT = callable(getattr(torch, "_log_softmax", None))


def _log_softmax_(logits: torch.Tensor) -> torch.Tensor:
    """`logits.log_softmax(-1)` written into `logits`."""
    global _LOG_SOFTMAX_OUT
    if _LOG_SOFTMAX_OUT:
        try:
            return torch._log_softmax(logits, -1, False, out=logits)
        except TypeError:  # a torch whose private signature changed (refused before writing): the public form hereon
            _LOG_SOFTMAX_OUT = False
    return logits.sub_(torch.logsumexp(logits, -1, keepdim=True))


class _ProjectedLabelSmoothedCrossEntropy(torch.autograd.Function):
    """§3.4 + §5.4 for training: the pre-softmax projection and the label-smoothed cross-entropy in one pass.

    Returns `scale * sum_rows CE_ls(hidden @ weight^T, labels)` for rows that are all real target tokens (the caller
    drops padding first). Per chunk of rows the logits are computed once and turned in place into log-probabilities,
    then into the gradient `softmax - (1 - eps) one_hot - eps / V`, multiplied back through the projection at once:
    the only vocabulary-sized tensor is that chunk, and backward only scales the two stored gradients.

    Under autocast the matrix products run in the autocast dtype; the softmax, the loss and the weight gradient stay
    in float32 (or float64).
    """

    @staticmethod
    def forward(ctx, hidden, weight, labels, label_smoothing: float, scale: float, chunk_rows: int, bias=None):
        device_type = hidden.device.type
        compute_dtype = torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else None
        with torch.autocast(device_type, enabled=False):
            compute_dtype = compute_dtype or hidden.dtype
            softmax_dtype = torch.promote_types(weight.dtype, torch.float32)
            h_all, w = hidden.to(compute_dtype), weight.to(compute_dtype)
            vocab = weight.shape[0]
            total = torch.zeros((), dtype=softmax_dtype, device=hidden.device)
            grad_hidden = torch.empty_like(h_all)
            grad_weight = None
            for start in range(0, hidden.shape[0], chunk_rows):
                h, target = h_all[start : start + chunk_rows], labels[start : start + chunk_rows]
                rows = torch.arange(target.shape[0], device=target.device)
                logits = (h @ w.T).to(softmax_dtype)
                if bias is not None:  # a constant (an imported checkpoint's logits bias): no gradient of its own
                    logits += bias
                # In place: a fresh chunk is slower to allocate and fill than this one (benchmarks/RESULTS.md, speed).
                log_probs = _log_softmax_(logits)
                # CE_ls = (1 - eps) * -log p(y) + eps * mean_v(-log p(v))
                total += (1 - label_smoothing) * -log_probs[rows, target].sum()
                total += label_smoothing / vocab * -log_probs.sum()
                grad_logits = log_probs.exp_()  # the same memory from here on
                grad_logits.sub_(label_smoothing / vocab)
                grad_logits[rows, target] -= 1 - label_smoothing
                grad_logits = grad_logits.to(compute_dtype)
                torch.mm(grad_logits, w, out=grad_hidden[start : start + chunk_rows]).mul_(scale)
                # beta=0: the zero is never read; alpha scales inside the matrix product, not in another pass.
                part = torch.addmm(grad_logits.new_zeros(()), grad_logits.T, h, beta=0, alpha=scale)
                grad_weight = part.to(weight.dtype) if grad_weight is None else grad_weight.add_(part)
        if grad_weight is None:  # no real target token in the batch
            grad_weight = torch.zeros_like(weight)
        ctx.save_for_backward(grad_hidden.to(hidden.dtype), grad_weight)
        return total * scale

    @staticmethod
    def backward(ctx, grad_output):
        grad_hidden, grad_weight = ctx.saved_tensors
        if grad_output.item() != 1.0:  # Trainer's loss is used as is; only scaled losses pay for another pass
            grad_hidden, grad_weight = grad_hidden * grad_output, grad_weight * grad_output
        return grad_hidden, grad_weight, None, None, None, None, None


def projected_label_smoothed_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    label_smoothing: float,
    scale: float,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """`scale * sum_rows CE_ls(hidden @ weight^T + bias, labels)` for rows that are all real target tokens, with
    gradients (none for `bias`, a constant), through `_ProjectedLabelSmoothedCrossEntropy` in chunks of at most
    `_LOSS_CHUNK_ELEMENTS` logits."""
    chunk_rows = max(1, _LOSS_CHUNK_ELEMENTS // weight.shape[0])
    if bias is not None:
        bias = bias.detach()
    return _ProjectedLabelSmoothedCrossEntropy.apply(hidden, weight, labels, label_smoothing, scale, chunk_rows, bias)


# The compiled loss splits the rows into a number of chunks fixed by the vocabulary alone (a number that depended on
# the batch would compile a graph for each): ceil(V * _COMPILED_LOSS_ROWS / _LOSS_CHUNK_ELEMENTS), so that a batch of
# up to this many target positions holds at most eager's chunk of logits at once (256 MB in float32).
_COMPILED_LOSS_ROWS = 2**14


class _ChunkedLabelSmoothedCrossEntropy(torch.autograd.Function):
    """`_ProjectedLabelSmoothedCrossEntropy` for torch.compile: every position of the batch (those labelled -100
    count for nothing), the rows padded to `chunks` equal chunks. Only functional ops on shapes the compiler keeps
    symbolic: selecting the real tokens or a chunk count from the batch's size would break or re-specialise the
    graph, and the compiler plans the buffers itself (no in-place log-softmax). `scale` is a tensor, so the batch's
    token count is no constant of the graph either. As in eager, the gradients are computed chunk by chunk in the
    forward pass and backward only scales them: no vocabulary-sized tensor outlives its chunk."""

    @staticmethod
    def forward(ctx, hidden, weight, labels, label_smoothing: float, scale, chunks: int, bias=None):
        device_type = hidden.device.type
        compute_dtype = torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else None
        with torch.autocast(device_type, enabled=False):
            compute_dtype = compute_dtype or hidden.dtype
            softmax_dtype = torch.promote_types(weight.dtype, torch.float32)
            vocab, pad = weight.shape[0], (-hidden.shape[0]) % chunks
            w = weight.to(compute_dtype)
            h_all = nn.functional.pad(hidden.to(compute_dtype), (0, 0, 0, pad)).unflatten(0, (chunks, -1))
            labels = nn.functional.pad(labels, (0, pad), value=-100).unflatten(0, (chunks, -1))
            total = torch.zeros((), dtype=softmax_dtype, device=hidden.device)
            grad_hidden, grad_weight = [], torch.zeros(weight.shape, dtype=softmax_dtype, device=weight.device)
            for h, target in zip(h_all.unbind(0), labels.unbind(0), strict=True):
                real = target.ne(-100).unsqueeze(1)
                index = target.clamp(min=0).unsqueeze(1)
                logits = (h @ w.T).to(softmax_dtype)
                if bias is not None:
                    logits = logits + bias
                log_probs = logits.log_softmax(-1)
                # CE_ls = (1 - eps) * -log p(y) + eps * mean_v(-log p(v)), for real tokens only
                row = (1 - label_smoothing) * log_probs.gather(1, index) + label_smoothing / vocab * log_probs.sum(
                    -1, keepdim=True
                )
                total = total - row.masked_fill(~real, 0).sum()
                # softmax - (1 - eps) one_hot - eps / V, zero on the rows that are not real tokens
                grad_logits = (log_probs.exp() - label_smoothing / vocab).scatter_add(
                    1, index, torch.full_like(index, label_smoothing - 1, dtype=softmax_dtype)
                )
                grad_logits = grad_logits.masked_fill(~real, 0).to(compute_dtype)
                grad_hidden.append(grad_logits @ w)
                grad_weight = grad_weight + (grad_logits.T @ h).to(softmax_dtype)
            grad_hidden = torch.cat(grad_hidden)[: hidden.shape[0]]
        ctx.save_for_backward(grad_hidden.to(hidden.dtype) * scale, grad_weight.to(weight.dtype) * scale)
        return total * scale

    @staticmethod
    def backward(ctx, grad_output):
        grad_hidden, grad_weight = ctx.saved_tensors
        return grad_hidden * grad_output, grad_weight * grad_output, None, None, None, None, None


def chunked_label_smoothed_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    label_smoothing: float,
    scale: torch.Tensor,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """`projected_label_smoothed_cross_entropy` over every row of `hidden` (rows labelled -100 count for nothing), as
    torch.compile traces it: one graph for every batch shape, in `ceil(V * _COMPILED_LOSS_ROWS /
    _LOSS_CHUNK_ELEMENTS)` chunks of rows (`_ChunkedLabelSmoothedCrossEntropy`); `scale` a tensor."""
    chunks = max(1, -(-weight.shape[0] * _COMPILED_LOSS_ROWS // _LOSS_CHUNK_ELEMENTS))
    if bias is not None:
        bias = bias.detach()
    return _ChunkedLabelSmoothedCrossEntropy.apply(hidden, weight, labels, label_smoothing, scale, chunks, bias)


__all__ = ["apply_dropout", "chunked_label_smoothed_cross_entropy", "projected_label_smoothed_cross_entropy"]
