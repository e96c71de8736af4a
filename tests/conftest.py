import os

import pytest
import torch

import vaswani_mt
from vaswani_mt.tokenization import train_tokenizer

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

SENTENCES = [
    ("The girl ate an apple.", "Das Mädchen hat einen Apfel gegessen."),
    ("How are you today?", "Wie geht es Ihnen heute?"),
    ("The street is closed because of the snow.", "Die Straße ist wegen des Schnees gesperrt."),
    ("I would like a coffee, please!", "Ich hätte gern einen Kaffee, bitte!"),
    ("She reads a book in the café.", "Sie liest ein Buch im Café."),
    ("We are annoyed about the oil price.", "Wir ärgern uns über den Ölpreis."),
]


@pytest.fixture(scope="session")
def tokenizer():
    texts = [side for pair in SENTENCES for side in pair] * 4
    return train_tokenizer(texts, vocab_size=200, min_frequency=1)


def make_model(seed: int = 0, **overrides) -> vaswani_mt.VaswaniForConditionalGeneration:
    torch.manual_seed(seed)
    config = vaswani_mt.VaswaniConfig.from_preset("tiny", **{"vocab_size": 200, **overrides})
    return vaswani_mt.VaswaniForConditionalGeneration(config).eval()


@pytest.fixture
def model():
    return make_model()


def uneven_pairs() -> list[dict]:
    """Four pairs whose source and target token counts all differ: a mean of per-batch means is not the mean."""
    rows = []
    for i, (src, tgt) in enumerate([(6, 2), (3, 9), (5, 5), (4, 1)]):
        g = torch.Generator().manual_seed(i)
        rows.append(
            {
                "input_ids": [*torch.randint(4, 200, (src,), generator=g).tolist(), 2],
                "labels": [*torch.randint(4, 200, (tgt,), generator=g).tolist(), 2],
            }
        )
    return rows


def one_sgd_step_arguments(output_dir, per_device: int, accumulation: int = 1, use_cpu: bool = True):
    """One plain SGD step at lr 1: the update is the gradient itself, so equal updates mean equal gradients."""
    from transformers import Seq2SeqTrainingArguments

    return Seq2SeqTrainingArguments(
        output_dir=str(output_dir),
        per_device_train_batch_size=per_device,
        gradient_accumulation_steps=accumulation,
        max_steps=1,
        learning_rate=1.0,
        optim="sgd",
        lr_scheduler_type="constant",
        report_to=[],
        save_strategy="no",
        use_cpu=use_cpu,
        disable_tqdm=True,
        logging_steps=1,
        ddp_find_unused_parameters=False,
        seed=0,
    )


def padded_batch(seed: int = 0, lengths=(7, 4, 5), vocab: int = 200, pad: int = 1):
    """Source ids (specials 0-3 avoided, EOS=2 last) right-padded with `pad`, and the matching attention mask."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.full((len(lengths), max(lengths)), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, length in enumerate(lengths):
        ids[row, : length - 1] = torch.randint(4, vocab, (length - 1,), generator=generator)
        ids[row, length - 1] = 2
        mask[row, :length] = 1
    return ids, mask
