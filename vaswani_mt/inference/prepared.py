"""Prepared weights for inference, as CTranslate2 prepares them: each linear layer's weight reordered once into
oneDNN's blocked layout (`PreparedLinear`), where a plain product lays it out again at every call.

A decoder step multiplies few rows (beams x sentences still searched) by each weight, so laying the weight out
costs as much as the arithmetic. MKL's packed GEMM (the payload's `fast_paths_vaswani._project`, float32) packs for
one row count and packs again whenever sentences leave the batch; oneDNN's reordered weight serves every row count,
so it is packed once per layer. Private torch ops (`torch.ops.mkldnn._reorder_linear_weight` and
`_linear_pointwise`, what inductor's `freezing` calls for bf16 weights) behind a feature check, `F.linear`
otherwise; in inference/ only, so that the saved model (the payload) is unchanged.
"""

from __future__ import annotations

import copy

import torch
from torch import nn


def _has_onednn_prepacked(ops=None) -> bool:
    """Whether this torch can reorder a weight once for oneDNN and multiply by the reordered copy (`ops`: the
    namespace of both, torch.ops.mkldnn)."""
    ops = torch.ops.mkldnn if ops is None else ops
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        return all(callable(getattr(ops, name, None)) for name in ("_reorder_linear_weight", "_linear_pointwise"))
    except RuntimeError:  # a torch.ops namespace raises for an op it does not have
        return False


ONEDNN_PREPACKED = _has_onednn_prepacked()


class PreparedLinear(nn.Module):
    """`nn.Linear` for inference through a copy of its weight reordered once for oneDNN (`packed`, an opaque tensor
    that is neither saved nor copied); `F.linear` under autograd, off the CPU or for another input dtype. Equal to
    the linear layer it replaces up to the order of the sums (bf16: bit for bit in our checks)."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias  # the same tensors: a tied weight stays tied
        self.packed = torch.ops.mkldnn._reorder_linear_weight(self.weight.detach(), None)

    def forward(self, states: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() or states.device.type != "cpu" or states.dtype != self.weight.dtype:
            return nn.functional.linear(states, self.weight, self.bias)
        bias = None if self.bias is None else self.bias.detach()
        return torch.ops.mkldnn._linear_pointwise(states, self.packed, bias, "none", [], "")

    def __deepcopy__(self, memo: dict) -> PreparedLinear:
        """A copy reordered anew from copies of the weight and bias (`memo`: a tied weight stays tied to its copy);
        an opaque reordered tensor cannot be copied."""
        linear = nn.Linear(self.in_features, self.out_features, bias=self.bias is not None, device="meta")
        linear.weight, linear.bias = copy.deepcopy(self.weight, memo), copy.deepcopy(self.bias, memo)
        return PreparedLinear(linear)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, prepacked {self.weight.dtype}"


def prepare_weights(model: nn.Module) -> nn.Module:
    """`model` (on a CPU, for inference) with every bf16 `nn.Linear` replaced, in place, by a `PreparedLinear`
    (float32 stays on the payload's path: oneDNN sums it in another order); unchanged where this torch lacks the ops
    (`ONEDNN_PREPACKED`)."""
    if not ONEDNN_PREPACKED:
        return model
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if type(child) is nn.Linear and child.weight.dtype == torch.bfloat16 and child.weight.device.type == "cpu":
                setattr(module, name, PreparedLinear(child))
    return model


__all__ = ["ONEDNN_PREPACKED", "PreparedLinear", "prepare_weights"]
