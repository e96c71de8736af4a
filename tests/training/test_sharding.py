"""FSDP2 with the tied matrix (issue 64, item 4): the tiny model sharded on 2 gloo ranks (tests/fsdp_worker.py), by
`sharding.shard_model` and by accelerate's own FSDP2 layout, against the same two Adam steps unsharded in this
process: the losses and step 1's gradients equal within float32 round-off, the resume from the sharded checkpoint
bit-exact, and the gathered `save_pretrained` folder the unsharded model's weights."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import PaddingOnlyTokenizer, free_port, make_model, rng_kept, uneven_pairs
from safetensors.torch import load_file
from transformers import DataCollatorForSeq2Seq

import vaswani_mt

ROOT = Path(__file__).resolve().parents[2]


def unsharded_steps():
    """The worker's two steps in one process on the whole batch: losses, step 1's gradients, the final weights."""
    collate = DataCollatorForSeq2Seq(PaddingOnlyTokenizer(), label_pad_token_id=-100)
    model = make_model(seed=0, dropout=0.0).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, betas=(0.9, 0.98), eps=1e-9)
    losses, grads = [], None
    for rows in (uneven_pairs(), uneven_pairs()[::-1]):
        loss = model(**collate(rows)).loss
        loss.backward()
        losses.append(float(loss.detach()))
        if grads is None:
            grads = {name: p.grad.clone() for name, p in model.named_parameters()}
        optimizer.step()
        optimizer.zero_grad()
    return losses, grads, model


MODES = ("torch", "resharded", "accelerate", "bf16")


def test_fsdp2_trains_the_tied_model_like_one_process_and_resumes_bit_exact(tmp_path):
    """One launch runs the layouts in turn (`torch`: shard_model; `resharded`: the shared matrix's group resharded
    before the loss, which then gathers it; `accelerate`: accelerate's FSDP2 layout; `bf16`: shard_model with bf16
    weights for the step, against the model cast to bf16 in one process)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "",
           "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}  # fmt: skip
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
               str(free_port()), str(ROOT / "tests" / "fsdp_worker.py"), str(tmp_path), ",".join(MODES)]  # fmt: skip
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    with rng_kept():
        losses, grads, model = unsharded_steps()
    reference = model.state_dict()
    for mode in MODES[:-1]:
        check(tmp_path / mode, losses, grads, reference)
    check_bf16(tmp_path / "bf16")


def check_bf16(folder: Path) -> None:
    """bf16 weights gathered once for the step: step 1's loss is the bf16 model's; the gradients, reduced in float32
    from bf16 ones, within bf16 round-off of its; the weights stay float32 (the optimizer's, and the saved ones)."""
    sharded = json.loads((folder / "result.json").read_text())
    collate = DataCollatorForSeq2Seq(PaddingOnlyTokenizer(), label_pad_token_id=-100)
    with rng_kept():
        model = make_model(seed=0, dropout=0.0).train().to(torch.bfloat16)
        loss = model(**collate(uneven_pairs())).loss
        loss.backward()
    assert sharded["losses"][0] == pytest.approx(float(loss.detach()), rel=1e-6)
    assert sharded["bit_exact"] and sharded["resumed_loss"] == sharded["losses"][1]
    sharded_grads = load_file(folder / "grads.safetensors")
    for name, p in model.named_parameters():
        grad = p.grad.float()
        assert sharded_grads[name].dtype == torch.float32
        torch.testing.assert_close(sharded_grads[name], grad, atol=2e-2 * float(grad.abs().max()), rtol=0, msg=name)
    saved = vaswani_mt.VaswaniForConditionalGeneration.from_pretrained(folder / "pretrained")
    assert {p.dtype for p in saved.parameters()} == {torch.float32}


def check(folder: Path, losses, grads, reference) -> None:
    sharded = json.loads((folder / "result.json").read_text())
    assert sharded["losses"] == pytest.approx(losses, rel=1e-5), folder.name
    assert sharded["bit_exact"] and sharded["resumed_loss"] == sharded["losses"][1]
    # the tied matrix is one parameter, sharded once (the worker lists each parameter once)
    assert set(sharded["params"]) == set(grads) and "model.shared.weight" in sharded["params"]
    sharded_grads = load_file(folder / "grads.safetensors")
    for name, grad in grads.items():
        torch.testing.assert_close(sharded_grads[name], grad, atol=1e-6, rtol=1e-5, msg=f"{folder.name}: {name}")
    saved = vaswani_mt.VaswaniForConditionalGeneration.from_pretrained(folder / "pretrained")
    assert saved.lm_head.weight is saved.model.shared.weight is saved.model.encoder.embed_tokens.weight
    for name, weight in saved.state_dict().items():
        torch.testing.assert_close(weight, reference[name], atol=1e-6, rtol=1e-5, msg=f"{folder.name}: {name}")
