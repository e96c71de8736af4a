import json
import os
import sys
from pathlib import Path

import pytest
import torch

import vaswani_mt
from vaswani_mt.data.tokenization import train_tokenizer

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ROOT = Path(__file__).resolve().parent.parent

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


def one_sgd_step_arguments(output_dir, per_device: int, accumulation: int = 1, use_cpu: bool = True, *,
                           max_steps: int = 1, learning_rate: float = 1.0, seed: int = 0):  # fmt: skip
    """Plain SGD at a constant rate, by default one step at lr 1: the update is the gradient itself, so equal
    updates mean equal gradients."""
    from transformers import Seq2SeqTrainingArguments

    return Seq2SeqTrainingArguments(
        output_dir=str(output_dir),
        per_device_train_batch_size=per_device,
        gradient_accumulation_steps=accumulation,
        max_steps=max_steps,
        learning_rate=learning_rate,
        optim="sgd",
        lr_scheduler_type="constant",
        report_to=[],
        save_strategy="no",
        use_cpu=use_cpu,
        disable_tqdm=True,
        logging_steps=1,
        ddp_find_unused_parameters=False,
        seed=seed,
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


def fit_tiny_model(tokenizer, steps: int = 40, seed: int = 0) -> vaswani_mt.VaswaniForConditionalGeneration:
    """The tiny model fitted to SENTENCES (well under a second on one thread): unlike a random post-LN model, whose
    greedy output repeats one token, it translates them, so token-equality checks compare varied sequences."""
    model = make_model(seed=seed, dropout=0.0).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    batch = tokenizer([en for en, _ in SENTENCES], text_target=[de for _, de in SENTENCES], padding=True)
    batch = {key: torch.tensor(value) for key, value in batch.items()}
    labels = batch["labels"].masked_fill(batch["labels"] == tokenizer.pad_token_id, -100)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: one thread is many times faster on a busy 2-core machine
    try:
        for _ in range(steps):
            model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=labels).loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    finally:
        torch.set_num_threads(threads)
    return model.eval()


def card_values(model, tokenizer, score: dict, examples: list[str]) -> dict:
    """The values training fills the model card with (`training._card_values`), for a model fitted in a test."""
    from vaswani_mt.hub.card import search_summary, widget_yaml

    config = model.config
    return {
        "source_lang": "en",
        "target_lang": "de",
        "license": "apache-2.0",
        "dataset_id": "tests/six-sentences",
        "dataset_name": "six test sentences",
        "dataset_note": "the pairs of tests/conftest.py",
        "widget": widget_yaml(examples),
        "model_name": "vaswani-mt-tiny-en-de",
        "architecture": f"N = {config.num_encoder_layers}+{config.num_decoder_layers}, d_model = {config.d_model}",
        "vocab_size": len(tokenizer),
        "parameters": f"{sum(p.numel() for p in model.parameters()) / 1e6:.2f}M",
        "preset": "tiny",
        "initialisation": "Xavier-uniform linear layers, N(0, d_model^-0.5) embeddings (tensor2tensor's)",
        "train_pairs": len(SENTENCES),
        "lr_scale": 1.0,
        "warmup": 4,
        "label_smoothing": config.label_smoothing,
        "dropout": config.dropout,
        "max_tokens": 256,
        "steps": 40,
        "train_minutes": 0.01,
        "hardware": "CPU",
        "precision": "float32",
        "weights_note": "the final weights",
        "test_pairs": len(SENTENCES),
        "bleu": round(score["score"], 2),
        "chrf": round(score["chrf"], 2),
        "signature": score["signature"],
        "compound_split_bleu": round(score["compound_split_bleu"], 2) if "compound_split_bleu" in score else "n/a",
        "compound_split_signature": score.get("compound_split_signature", "not evaluated"),
        "search": search_summary(model.generation_config),
        "command": "pytest tests/",
        "limitations": "A test model: it knows six sentences.",
        "repo_id": "USER/vaswani-mt-tiny-en-de",
        "example": examples[0].replace('"', '\\"'),
    }


@pytest.fixture(scope="session")
def fitted_folder(tmp_path_factory, tokenizer):
    """A saved, fitted tiny model with its tokenizer and a model card rendered from a real evaluation (what
    scripts/train.py leaves in its output folder)."""
    from vaswani_mt.evaluation.metrics import evaluate_bleu
    from vaswani_mt.hub.card import render_model_card

    folder = tmp_path_factory.mktemp("fitted")
    model = fit_tiny_model(tokenizer)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    sources, references = [en for en, _ in SENTENCES], [de for _, de in SENTENCES]
    score = evaluate_bleu(model, tokenizer, sources, references, num_beams=1)
    (folder / "README.md").write_text(render_model_card(card_values(model, tokenizer, score, sources[:2])))
    return folder


class PaddingOnlyTokenizer:
    """What DataCollatorForSeq2Seq needs of a tokenizer: right padding with id 1 (the workers' token-id data)."""

    pad_token_id = 1
    padding_side = "right"

    def pad(self, features, return_tensors=None, **kwargs):
        width = max(len(f["input_ids"]) for f in features)
        return {
            "input_ids": torch.tensor([f["input_ids"] + [1] * (width - len(f["input_ids"])) for f in features]),
            "attention_mask": torch.tensor(
                [[1] * len(f["input_ids"]) + [0] * (width - len(f["input_ids"])) for f in features]
            ),
        }


def write_jsonl(path: Path, count: int = 240) -> Path:
    """`count` English-German pairs of 3 to 7 words from a 15-word vocabulary, as a jsonl corpus for training runs."""
    words = "the a house cat dog small big red green runs sleeps eats sees quickly today".split()
    german = "der die das Haus Katze Hund klein groß rot grün läuft schläft isst sieht schnell heute".split()
    rows = []
    for i in range(count):
        idx = [(i * 7 + k * 3) % len(words) for k in range(3 + i % 5)]
        en = " ".join(words[j] for j in idx).capitalize() + "."
        de = " ".join(german[j] for j in idx).capitalize() + "."
        rows.append(json.dumps({"translation": {"en": en, "de": de}}, ensure_ascii=False))
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return path


def train_command(data: Path, output: Path, *extra: str) -> list[str]:
    """`python scripts/train.py ...` for the tiny model on `data`: a checkpoint every 2 steps, one log row a step."""
    return [
        sys.executable, str(ROOT / "scripts" / "train.py"), "--dataset", str(data), "--output_dir", str(output),
        "--preset", "tiny", "--vocab_size", "300", "--max_tokens_per_batch", "256", "--warmup_steps", "4",
        "--logging_steps", "1", "--save_steps", "2", "--save_total_limit", "10", "--report_to", "none",
        "--dropout", "0.0", "--seed", "3", "--test_bleu", "false", "--disable_tqdm", "true", *extra,
    ]  # fmt: skip
