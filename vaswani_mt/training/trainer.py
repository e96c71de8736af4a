"""The paper's training recipe (§5) as a transformers `Seq2SeqTrainer`.

- `paper_learning_rate`: Eq. (3) as the paper writes it (transformers' `get_inverse_sqrt_schedule` has its shape
  but counts updates from 0, so its first rate is 0, and leaves the peak to the caller).
- `VaswaniTrainer`: token-budget batches (§5.1), the paper's schedule, token counts in the logs, checkpoints that
  are whole or absent; with `alignment_head`, a supervised alignment head (alignment_supervision.py).
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path

import torch
from accelerate.utils import gather_object
from torch.optim.lr_scheduler import LambdaLR
from torch.utils.data import DataLoader
from transformers import Seq2SeqTrainer
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from vaswani_mt.data.batching import TokenBudgetBatchSampler, length_array

from .alignment_supervision import ALIGNMENT_LAMBDA, alignment_loss
from .bf16_weights import Bf16Weights
from .callbacks import SamplerEpochCallback
from .checkpoints import CheckpointError, describe_write_failure, is_complete
from .machines import machines
from .sharding import share_embedding_module

logger = logging.getLogger(__name__)


def paper_learning_rate(step: int, d_model: int, warmup_steps: int, scale: float = 1.0) -> float:
    """§5.3 Eq. (3): `scale * d_model^-0.5 * min(step^-0.5, step * warmup_steps^-1.5)`, for update `step` >= 1.

    Linear warmup for `warmup_steps` updates, peak `scale * (d_model * warmup_steps)^-0.5`, then inverse square root
    decay. `scale` is 1 in the paper; small models trained for minutes can need another peak (`--lr_scale`).
    """
    step = max(step, 1)
    return scale * d_model**-0.5 * min(step**-0.5, step * warmup_steps**-1.5)


# ---------------------------------------------------------------------------------------------------------------
# The Trainer


class VaswaniTrainer(Seq2SeqTrainer):
    """`Seq2SeqTrainer` with the paper's batching and schedule, and token counts in the logs.

    `max_tokens_per_batch` switches the training DataLoader to `TokenBudgetBatchSampler` (per device; each rank
    gets distinct batches and the same number of steps). `lr_schedule="paper"` replaces `--lr_scheduler_type`
    and `--learning_rate` with Eq. (3) times `lr_scale`. Logs gain `source_tokens_per_step`,
    `target_tokens_per_step` (whole optimizer step, all processes), `target_tokens_per_second` and `train_minutes`
    (wall time of training, a resumed run's earlier minutes included). `alignment_head` (layer, head): that head
    of the encoder-decoder attention learns the batches' `alignment_targets` with weight `alignment_lambda`
    (Garg et al. 2019), recorded in the model's `config.alignment_head`; the logs gain `alignment_loss`.
    `bf16_weights`: the forward and backward on bf16 copies of the weights made once per optimizer step, Adam on the
    float32 ones (bf16_weights.py; one process).
    """

    def __init__(
        self,
        *args,
        max_tokens_per_batch: int | None = None,
        lr_schedule: str = "paper",
        lr_scale: float = 1.0,
        alignment_head: tuple[int, int] | None = None,
        alignment_lambda: float = ALIGNMENT_LAMBDA,
        bf16_weights: bool = False,
        **kwargs,
    ):
        super().__init__(*args, **kwargs)
        if lr_schedule not in ("paper", "trainer"):
            raise ValueError(f"lr_schedule must be 'paper' or 'trainer', got {lr_schedule!r}")
        if not lr_scale > 0:
            raise ValueError(f"lr_scale (Eq. (3)'s multiplier) must be above 0, got {lr_scale}")
        self.max_tokens_per_batch = max_tokens_per_batch
        self.lr_schedule = lr_schedule
        self.lr_scale = lr_scale
        self.alignment_head, self.alignment_lambda = alignment_head, alignment_lambda
        self._alignment_losses: list[float] = []
        if alignment_head is not None:
            self.model.config.alignment_head = list(alignment_head)
        self.token_sampler: TokenBudgetBatchSampler | None = None
        self._token_counts = torch.zeros(2, dtype=torch.long)  # source, target tokens since the last log
        self._micro_batches = 0
        self._steps = 0.0  # optimizer steps since the last log; a short last step of an epoch counts whole
        self._window_start: float | None = None
        self._train_start: float | None = None
        self._weights_written = False  # in `_save_checkpoint`: whether this checkpoint's weights are written
        if max_tokens_per_batch:
            self.add_callback(SamplerEpochCallback(self))
        if bf16_weights and (self.args.world_size > 1 or self.is_fsdp_enabled):
            count = self.args.world_size
            here = f"{count} process{'es' if count > 1 else ''}" + (" under FSDP" if self.is_fsdp_enabled else "")
            raise ValueError(
                f"--bf16_weights trains one process without FSDP, not {here}: DDP reduces the float32 weights' "
                "gradients, which the bf16 copies bypass; under FSDP, --bf16 (FSDP's mixed precision) keeps bf16 ones"
            )
        self.bf16_weights = bf16_weights
        self._bf16_copies: Bf16Weights | None = None  # made at the first step, on the model's device
        if self.is_fsdp_enabled:  # FSDP shards the tied matrix in one group with every module using it (§3.4)
            share_embedding_module(self.model)
        self._first_step_seconds: float | None = None  # under --torch_compile: the first step, mostly compiling
        if self.args.torch_compile:
            # inductor's caches (compiled kernels and graphs) beside the checkpoints, so that a restart or a resume
            # of the run compiles from them; `_` keeps Trainer's push_to_hub from uploading them
            if os.environ.get("TORCHINDUCTOR_CACHE_DIR") in (None, _default_inductor_cache()):  # not the user's
                os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(Path(self.args.output_dir).resolve() / COMPILE_CACHE)

    def get_train_dataloader(self) -> DataLoader:
        if not self.max_tokens_per_batch:
            return super().get_train_dataloader()
        dataset = self.train_dataset
        sampler = TokenBudgetBatchSampler(
            length_array(dataset, "source_length"),
            length_array(dataset, "target_length"),
            self.max_tokens_per_batch,
            shuffle=True,
            seed=self.args.data_seed if self.args.data_seed is not None else self.args.seed,
            num_replicas=max(1, self.args.world_size),
            rank=self.args.process_index,
        )
        dataset = self._remove_unused_columns(dataset, description="training")
        loader = DataLoader(
            dataset,
            batch_sampler=sampler,
            collate_fn=self.data_collator,
            num_workers=self.args.dataloader_num_workers,
            pin_memory=self.args.dataloader_pin_memory and torch.cuda.is_available(),
        )
        loader = self.accelerator.prepare(loader)
        _pass_every_batch(loader, sampler)  # the sampler already gives each rank its own batches
        self.token_sampler = sampler
        return loader

    def create_scheduler(self, num_training_steps: int, optimizer=None):
        if self.lr_schedule != "paper":
            return super().create_scheduler(num_training_steps, optimizer)
        if self.lr_scheduler is None:
            optimizer = optimizer if optimizer is not None else self.optimizer
            warmup = self.args.get_warmup_steps(num_training_steps)
            if warmup < 1:
                raise ValueError(f"the paper's schedule needs warmup_steps >= 1, got {self.args.warmup_steps}")
            for group in optimizer.param_groups:  # LambdaLR multiplies this base rate: Eq. (3)'s scale
                group["lr"] = self.lr_scale
            # LambdaLR's index 0 is the first update, the paper's step 1.
            schedule = partial(_paper_lambda, d_model=self.model.config.d_model, warmup=warmup)
            self.lr_scheduler = LambdaLR(optimizer, schedule)
        return self.lr_scheduler

    def training_step(self, model, inputs, num_items_in_batch=None):
        if self._window_start is None:
            self._window_start = time.perf_counter()
        if self._train_start is None:
            # A resumed run goes on from the training minutes it had logged before it stopped.
            before = [row["train_minutes"] for row in self.state.log_history if "train_minutes" in row]
            self._train_start = self._window_start - 60 * max(before, default=0.0)
        self._micro_batches += 1
        # transformers gives an epoch's last update fewer micro-batches when they do not divide evenly
        self._steps += 1 / getattr(self, "current_gradient_accumulation_steps", self.args.gradient_accumulation_steps)
        self._token_counts[0] += int(inputs["attention_mask"].sum())
        self._token_counts[1] += int(inputs["labels"].ne(-100).sum())
        if self._first_step_seconds is not None or not self.args.torch_compile:
            return super().training_step(model, inputs, num_items_in_batch)
        start = time.perf_counter()
        loss = super().training_step(model, inputs, num_items_in_batch)
        self._first_step_seconds = time.perf_counter() - start
        return loss

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """The model's loss, plus `alignment_lambda` times the alignment term where the batch has
        `alignment_targets` (training batches of a run with `alignment_head`)."""
        targets = inputs.pop("alignment_targets", None)
        if self.args.torch_compile and model.training:
            _mark_dynamic_lengths(inputs)
        if self.bf16_weights and model.training:
            if self._bf16_copies is None:
                self._bf16_copies = Bf16Weights(model)
            model = self._bf16_copies.bind(model, self.state.global_step)
        if targets is None or self.alignment_head is None:
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        loss, outputs = super().compute_loss(model, {**inputs, "output_attentions": True}, True, num_items_in_batch)
        layer, head = self.alignment_head
        term = alignment_loss(outputs.cross_attentions[layer][:, head], targets.to(loss.device))
        self._alignment_losses.append(float(term.detach()))
        loss = loss + self.alignment_lambda * term
        return (loss, outputs) if return_outputs else loss

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        if "loss" in logs and "eval_loss" not in logs and self._micro_batches:
            counts = self.accelerator.reduce(self._token_counts.to(self.args.device), reduction="sum").cpu()
            steps = max(round(self._steps, 6), 1e-9)
            seconds = max(time.perf_counter() - self._window_start, 1e-9)
            logs["source_tokens_per_step"] = round(int(counts[0]) / steps, 1)
            logs["target_tokens_per_step"] = round(int(counts[1]) / steps, 1)
            logs["target_tokens_per_second"] = round(int(counts[1]) / seconds, 1)
            logs["train_minutes"] = round((time.perf_counter() - self._train_start) / 60, 6)
            self._token_counts.zero_()
            self._micro_batches, self._steps, self._window_start = 0, 0.0, None
            logged = any("compile_seconds" in row for row in self.state.log_history)
            if self._first_step_seconds is not None and not logged:  # once, in the first log (of each start)
                logs["compile_seconds"] = round(self._first_step_seconds, 3)
            if self._alignment_losses:
                logs["alignment_loss"] = round(sum(self._alignment_losses) / len(self._alignment_losses), 4)
                self._alignment_losses.clear()
        super().log(logs, start_time)

    def _save_checkpoint(self, model, trial) -> None:
        """Trainer's checkpoint, with three guarantees more.

        - A folder of the same step from an earlier attempt is removed first: a checkpoint never mixes two attempts.
        - A failed write (a full disk, a file-size limit) removes the half-written folder and raises
          `CheckpointError`, naming the folder and the cause; the checkpoints before it are intact.
        - Under DDP the ranks exchange what failed after writing their parts, so a failure on one rank stops every
          rank here with the same `CheckpointError` instead of a hang in the next collective.

        Trainer writes into the final folder (it refers to it by that path while writing, so a temporary folder
        renamed into place would mean rewriting its method); `incomplete_reason` tells a cut-off folder apart.
        Why this overrides a private method (a callback's `on_save` comes only after a whole write): docs/internals.md.
        """
        # Trainer's folder: `output_dir` itself, as no trial runs here (`hyperparameter_search` is refused)
        folder = Path(self.args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
        if self.args.should_save and folder.exists():
            shutil.rmtree(folder)
        self.accelerator.wait_for_everyone()  # under DDP every rank writes its RNG state there: after the removal
        failure, cause = None, None
        self._weights_written = False
        try:
            super()._save_checkpoint(model, trial)
        except Exception as error:
            rank = self.args.process_index if self.args.world_size > 1 else None
            failure, cause = describe_write_failure(folder, error, rank, self.args.should_save), error
            if not self._weights_written and self._best_model_barrier_follows():
                torch.distributed.barrier()  # the one the other ranks wait in (Trainer's, after the weights)
        copies = self._copies_rng_states()
        own = folder / f"rng_state_{self.args.process_index}.pth"
        try:  # one outcome per rank ([...] alone outside DDP), with its RNG state where every machine keeps a copy
            outcomes = gather_object([(failure, own.read_bytes() if copies and failure is None else None)])
            failures = [text for text, _ in outcomes]
            if copies and not any(failures):
                failure = self._write_rng_states(folder, [state for _, state in outcomes])
                failures = gather_object([failure])
        except Exception:  # a rank died while the folder was written: what it left out, nobody writes now
            self._remove_if_incomplete(folder)
            raise
        if any(failures):
            self._remove_if_incomplete(folder)  # a whole one stays (a failed upload after the write, say)
            rank = next(rank for rank, text in enumerate(failures) if text)
            where = f" (rank {rank})" if len(failures) > 1 else ""
            raise CheckpointError(
                f"could not write checkpoint {folder}{where}: {failures[rank]}; the checkpoints before it are "
                "intact, and the same command resumes from the last of them"
            ) from cause

    def hyperparameter_search(self, *args, **kwargs):
        """Refused: each trial would write its checkpoints to a folder of its own, which the checkpoint guarantees of
        `_save_checkpoint` and the resume (`checkpoints.resume_point`) do not look in."""
        raise NotImplementedError("VaswaniTrainer runs no hyperparameter search: its checkpoints go to --output_dir")

    def _copies_rng_states(self) -> bool:
        """Whether each machine keeps a whole copy of every checkpoint (`machines.settle_storage`): then every
        rank's RNG state goes into every copy, so that any one machine's folder resumes the whole run."""
        return bool(self.args.save_on_each_node and not self.args.save_only_model and machines().count > 1)

    def _write_rng_states(self, folder: Path, states: list[bytes | None]) -> str | None:
        """Writes the other machines' RNG states into this machine's copy (main process, atomically); what failed,
        or None."""
        if not self.args.should_save:
            return None
        try:
            for rank, state in enumerate(states):
                path = folder / f"rng_state_{rank}.pth"
                if state is not None and not path.exists():
                    tmp = path.with_name(f".{path.name}.tmp")
                    tmp.write_bytes(state)
                    os.replace(tmp, path)
        except OSError as error:
            return describe_write_failure(folder, error, self.args.process_index)
        return None

    def _remove_if_incomplete(self, folder: Path) -> None:
        if self.args.should_save and not is_complete(folder, not self.args.save_only_model, self.args.world_size):
            shutil.rmtree(folder, ignore_errors=True)

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        with self._writing_on_this_machine():
            super().save_model(output_dir, _internal_call)
        self._weights_written = True  # `_save_checkpoint`: past the point where Trainer may wait for every rank

    @contextmanager
    def _writing_on_this_machine(self) -> Iterator[None]:
        """Lets another machine's main process write the weights of its own copy of a checkpoint
        (`save_on_each_node`): transformers' `save_pretrained` writes on global rank 0 alone under torch.distributed,
        whatever its `is_main_process` says, unless the model's `should_save_on_this_rank` answers otherwise."""
        model = self.accelerator.unwrap_model(self.model)
        if not (hasattr(model, "should_save_on_this_rank") and self.args.should_save and self.args.process_index):
            yield
            return
        model.should_save_on_this_rank = lambda is_main_process: is_main_process
        try:
            yield
        finally:
            del model.should_save_on_this_rank

    def _best_model_barrier_follows(self) -> bool:
        """Whether Trainer's `_save_checkpoint` has every rank wait in a barrier after the weights (while it tracks a
        best checkpoint under DDP): a rank whose weights failed must wait there too, or the collectives would differ."""
        distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
        return bool(
            distributed and self.state.best_global_step and self.args.save_strategy in ("steps", "epoch", "best")
        )

    def leave_process_group(self) -> None:
        """End this process's part in distributed training: wait for every rank, then close the process group.

        Call it on every rank once training is over: a rank that exits with the group open can abort in gloo's
        teardown, and the launcher then kills the others, maybe while rank 0 writes the model. Afterwards rank 0 goes
        on as a single process with `self.model`. No-op without a group.
        """
        if not torch.distributed.is_available() or not torch.distributed.is_initialized():
            return
        self.accelerator.wait_for_everyone()
        self.model_wrapped = self.model
        self.accelerator.free_memory()  # drops the DDP wrapper, optimizer and loaders accelerate holds; runs gc
        self.accelerator.end_training()  # destroy_process_group; gloo's threads are joined as the group goes


# The folder of inductor's caches in --output_dir under --torch_compile (unless TORCHINDUCTOR_CACHE_DIR is set).
COMPILE_CACHE = "_compile_cache"


def _default_inductor_cache() -> str | None:
    """inductor's own cache folder, which it also writes into TORCHINDUCTOR_CACHE_DIR once it has chosen it."""
    try:
        from torch._inductor.runtime.cache_dir_utils import default_cache_dir
    except ImportError:  # a torch that moved it: TORCHINDUCTOR_CACHE_DIR is left as it is
        return None
    return os.path.abspath(default_cache_dir())


# The batch's tensors whose sizes (sentences, padded length) change from batch to batch.
_VARYING_INPUTS = ("input_ids", "attention_mask", "labels", "decoder_input_ids", "decoder_attention_mask")


def _mark_dynamic_lengths(inputs: dict) -> None:
    """Under --torch_compile, the batch's sizes marked as varying before the compiled model sees them: the first
    step then compiles one graph for every batch size and padded length, instead of one for the first shape and a
    recompile for each size that changes later. torch still specialises a size of 1 (a batch of one sentence, a
    target of one token), so training compiles at most 3 graphs (tests/training/test_compiled_step.py)."""
    for name in _VARYING_INPUTS:
        tensor = inputs.get(name)
        if isinstance(tensor, torch.Tensor) and tensor.dim() == 2:
            torch._dynamo.maybe_mark_dynamic(tensor, 0)
            torch._dynamo.maybe_mark_dynamic(tensor, 1)


def _pass_every_batch(loader: DataLoader, sampler) -> None:
    """Under several processes accelerate's `prepare` wraps the loader's batch sampler in a `BatchSamplerShard`, which
    deals each rank every `num_processes`-th batch. For `sampler`, already one rank's, the wrapper is made to pass
    every batch, as transformers' Trainer does for its own rank-aware `BatchRebalanceSampler`; no accelerate option
    (`DataLoaderConfiguration`) leaves a batch sampler unsplit (docs/internals.md)."""
    shard = getattr(loader, "batch_sampler", None)
    if shard is not None and getattr(shard, "batch_sampler", None) is sampler:
        shard.num_processes, shard.process_index = 1, 0


def _paper_lambda(index: int, d_model: int, warmup: int) -> float:
    return paper_learning_rate(index + 1, d_model, warmup)


__all__ = ["VaswaniTrainer", "paper_learning_rate"]
