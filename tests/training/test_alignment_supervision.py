"""A supervised alignment head (Garg et al. 2019; `vaswani_mt.training.alignment_supervision`): the label
distributions a batch carries, the loss term (0 where the head matches, positive otherwise, its gradient only through
that head's attention), and a short training that records the head in the saved config."""

import sys

import pytest
import torch
from conftest import make_model, one_sgd_step_arguments, one_torch_thread
from datasets import Dataset
from transformers import DataCollatorForSeq2Seq

from vaswani_mt import VaswaniForConditionalGeneration
from vaswani_mt.inference.alignments import default_method, supervised_head
from vaswani_mt.training.alignment_supervision import (
    AlignmentCollator,
    alignment_loss,
    alignment_targets,
    penultimate_head,
)
from vaswani_mt.training.trainer import VaswaniTrainer

pytestmark = pytest.mark.transformers_internals


def test_targets_are_uniform_over_the_linked_source_tokens_and_empty_without_a_link():
    targets = alignment_targets([[0, 1, 0, 2, 2, 0], []], target_length=4, source_length=3)
    assert targets[0, 0].tolist() == [0.0, 0.5, 0.5] and targets[0, 2].tolist() == [1.0, 0.0, 0.0]
    assert targets[0, 1].sum() == 0 and targets[0, 3].sum() == 0 and targets[1].sum() == 0
    # a left-padded source shifts the columns by its padding
    assert alignment_targets([[0, 0]], 1, 3, source_offsets=[2])[0, 0].tolist() == [0.0, 0.0, 1.0]


def test_the_loss_is_zero_where_the_head_matches_the_labels_and_positive_elsewhere():
    targets = alignment_targets([[0, 1, 0, 2, 2, 0]], target_length=3, source_length=3)
    matching = targets.clone()
    matching[0, 1] = torch.tensor([0.2, 0.3, 0.5])  # a row without a link does not count
    assert alignment_loss(matching, targets).item() == pytest.approx(0.0, abs=1e-6)
    uniform = torch.full((1, 3, 3), 1 / 3)
    assert alignment_loss(uniform, targets).item() > 0.1
    assert alignment_loss(uniform, torch.zeros(1, 3, 3)).item() == 0.0  # no link in the batch: no term


def test_the_gradient_reaches_only_what_computes_the_supervised_attention():
    model = make_model(dropout=0.0).train()
    layer, head = penultimate_head(model.config.num_decoder_layers)
    assert (layer, head) == (0, 0)  # the tiny preset's 2 decoder layers
    model.set_attn_implementation("eager")
    ids = torch.tensor([[5, 6, 7, 2]])
    out = model(input_ids=ids, decoder_input_ids=torch.tensor([[0, 8, 9]]), output_attentions=True)
    targets = alignment_targets([[0, 0, 1, 1, 2, 2]], 3, 4)
    alignment_loss(out.cross_attentions[layer][:, head], targets).backward()
    touched = {name for name, p in model.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0}
    assert {
        "model.decoder.layers.0.cross_attn.q_proj.weight",
        "model.decoder.layers.0.cross_attn.k_proj.weight",
    } <= touched
    untouched = [name for name in dict(model.named_parameters()) if "decoder.layers.1." in name
                 or any(part in name for part in ("layers.0.cross_attn.v_proj", "layers.0.cross_attn.out_proj",
                                                  "decoder.layers.0.ffn"))]  # fmt: skip
    assert untouched and not touched & set(untouched)


def test_two_steps_with_supervision_save_a_config_that_names_the_head(tmp_path, tokenizer):
    rows = [{"input_ids": tokenizer(en)["input_ids"], "labels": tokenizer(text_target=de)["input_ids"]}
            for en, de in [("the house", "das Haus"), ("a small dog", "ein kleiner Hund")]]  # fmt: skip
    for row in rows:  # target token t to source token t
        row["alignment"] = [k for t in range(min(len(row["labels"]), len(row["input_ids"])) - 1) for k in (t, t)]
    model = make_model(vocab_size=len(tokenizer)).train()
    model.set_attn_implementation("eager")
    args = one_sgd_step_arguments(tmp_path / "run", per_device=2, max_steps=2, learning_rate=0.01)
    args.remove_unused_columns = False
    collator = AlignmentCollator(DataCollatorForSeq2Seq(tokenizer, model=model, label_pad_token_id=-100))
    head = penultimate_head(model.config.num_decoder_layers)
    trainer = VaswaniTrainer(model=model, args=args, train_dataset=Dataset.from_list(rows), data_collator=collator,
                             lr_schedule="trainer", alignment_head=head)  # fmt: skip
    with one_torch_thread():
        trainer.train()
    assert any("alignment_loss" in row for row in trainer.state.log_history)
    trainer.save_model(str(tmp_path / "saved"))
    loaded = VaswaniForConditionalGeneration.from_pretrained(tmp_path / "saved")
    assert loaded.config.alignment_head == [0, 0] and supervised_head(loaded.config) == (0, 0)
    assert default_method(loaded) == default_method(make_model()) == "mean"  # the head is asked for by name


def test_supervision_without_eflomal_fails_with_one_line_that_says_how_to_install_it(tmp_path, monkeypatch):
    from vaswani_mt.training.arguments import check_dataset_options, parse_args

    monkeypatch.setitem(sys.modules, "eflomal", None)  # as if it were not installed
    _, data_args, recipe, _ = parse_args(["--output_dir", str(tmp_path), "--report_to", "none",
                                          "--alignment_supervision"])  # fmt: skip
    with pytest.raises(ValueError, match=r"pip install 'vaswani-mt\[align\]'") as error:
        check_dataset_options(data_args, recipe)
    assert "\n" not in str(error.value)


def test_the_links_of_a_corpus_held_in_memory_are_cached_in_vaswani_mts_cache_folder(tokenizer, tmp_path, monkeypatch):
    """The built-in corpus has no cache files: its eflomal links go to vaswani_mt's cache (keyed by the pairs), so a
    resumed run reads them instead of aligning again (about 31 s on the main job's corpus)."""
    from vaswani_mt.training import alignment_supervision

    asked = []
    monkeypatch.setenv("VASWANI_MT_CACHE", str(tmp_path))
    monkeypatch.setattr(alignment_supervision, "symmetrized_links",
                        lambda pairs, cache: asked.append(cache) or [set() for _ in pairs])  # fmt: skip
    batch = tokenizer(["The house is small."], text_target=["Das Haus ist klein."])
    dataset = Dataset.from_dict({"input_ids": batch["input_ids"], "labels": batch["labels"]})
    labelled = alignment_supervision.add_alignment_labels(dataset, tokenizer)
    assert dataset.cache_files == [] and "alignment" in labelled.column_names
    assert asked == [tmp_path / "alignments"]
