#!/usr/bin/env python
"""Word alignments from cross-attention (vaswani_mt/inference/alignments.py) and markup carried by them, measured on
the built-in test split with the main job's model.

1. Dictionary-anchored precision, per method (all layers and heads averaged, each decoder layer, each of these with
   shift-att, the supervised head of a model trained with --alignment_supervision, and a diagonal baseline): the
   test sources are translated once with alignments (the model's search, batch 16), then aligned again by each
   method from the same attention (`realign`). A German output word is
   anchored where the Ding dictionary pairs it with a word of its source: one-word entries on both sides (annotations
   removed, English "to " dropped), letters only, 4 or more, lower-cased, words compared without punctuation. Anchored
   precision: of the links from anchored German words, the share that lands on one of its dictionary words; pair
   recall: of the (source word, output word) dictionary pairs of a sentence, the share that some link joins.
2. For the best method, the hard rule (argmax, intersect, thresholds) and the merge of source pieces (sum, mean).
3. Silver AER (with `--eflomal`, where `import eflomal` works: an optional package, never a dependency): eflomal
   aligns the training split together with (test source, our output), both directions, symmetrized by
   grow-diag-final-and; that is the reference, a statistical aligner's guess and not gold. For scale: each of
   eflomal's directions and its intersection against its own grow-diag-final-and.
4. Speed: the test split translated with and without alignments, interleaved, medians (run under `flock` on a shared
   machine).
5. Markup: each test sentence with a dictionary term (its English side in the source, its German side in the
   reference) gets its first such English word wrapped in `<b>...</b>` and the German word as a constraint, with that
   English word as its source side (docs/constraints.md); `translate(..., markup="xml")`: share of lines with the
   term inside the `<b>` element, share well-formed with the same tags.
6. Markup as localizers write it (`--markup_heldout benchmarks/markup_heldout.jsonl`: this part and 5 only):
   245 UI strings and document sentences written for the test (pairs, void tags at the edges and between words,
   entities, `%%` and `{{ }}`, placeholders, comments and CDATA, stray `<` and `&`, broken lines, plain lines),
   translated with `markup="xml"`: well-formed share (XML, or HTML where the line uses HTML's markup), tags,
   placeholders and literals, comments each exactly once, void tags at the line's edges still there, broken lines
   warned by number, lines without markup unchanged. Span precision on the 117 lines with a hand-marked German
   reference (184 pairs; 47 real UI strings with attributes, nesting and two tags a line, 92 pairs; 70 sentences):
   the reference (tags taken out) is aligned to its source by the model, teacher-forced, the source's tags put back
   by `restore`, and each pair's target words compared with the hand-marked ones. Each such line records its
   `split`: the span rule (spans.py) is chosen on the dev part (every third line: 39 lines, 61 pairs) and measured
   on the test part (78 lines, 123 pairs).
7. Speed (`--markup_speed`): section 5's lines (no constraints) with `markup="xml"` against their text with
   `alignments="hard"`, interleaved rounds (`--repeats`), medians; run it on a quiet machine.

    python benchmarks/alignments.py outputs/ding-cpu --eflomal --json benchmarks/alignments_2026-11-26.json
    python benchmarks/alignments.py outputs/ding-cpu --markup_heldout benchmarks/markup_heldout.jsonl
    python benchmarks/alignments.py outputs/ding-cpu --markup_speed --repeats 5
"""

import collections
import json
import logging
import logging.handlers
import re
import time
from functools import partial
from pathlib import Path

import torch
from speed_common import MachineRecord, command_parser, run_sides, split_pairs
from terminology import ANNOTATIONS, dictionary_entries

from vaswani_mt.data.alignment_labels import eflomal_links, grow_diag_final_and, require_eflomal
from vaswani_mt.data.corpus import _fetch_ding_dictionary, cache_dir
from vaswani_mt.inference.alignments import align_outputs, default_method, hard_links, realign, supervised_head
from vaswani_mt.inference.controls import ControlReport
from vaswani_mt.inference.loading import load_for_inference
from vaswani_mt.inference.markup import comments, parse_markup, placeholders, restore, tags, well_formed
from vaswani_mt.inference.spans import SPAN_RULE, SPAN_RULES
from vaswani_mt.inference.translate import translate
from vaswani_mt.system import native_bf16

ENGLISH = re.compile(r"^[a-z]{4,}$")
GERMAN = re.compile(r"^[a-zäöüß]{4,}$")
BATCH = 16
_VOID_TAGS = r"(?:\s*<(?:br|hr|img|wbr|input)\b[^<>]*>)+"


def percent(part: float, whole: float) -> float:
    """`part` of `whole` in percent, one decimal (0 where `whole` is 0)."""
    return round(100 * part / max(whole, 1), 1)


def dictionary_pairs(path: Path) -> set[tuple[str, str]]:
    """(English word, German word), lower-cased, from the dictionary's one-word sub-entries (module docstring)."""
    pairs = set()
    for de, en in dictionary_entries(path):
        de, en = (re.sub(r"\s+", " ", ANNOTATIONS.sub("", text)).strip().lower() for text in (de, en))
        en = en.removeprefix("to ")
        if ENGLISH.match(en) and GERMAN.match(de):
            pairs.add((en, de))
    return pairs


def _norm(word: str) -> str:
    return re.sub(r"^\W+|\W+$", "", word).lower()


def anchors(aligned, pairs) -> dict[int, set[int]]:
    """Anchored German output words: target word -> the source words the dictionary pairs it with."""
    source = [_norm(w) for w in aligned.source_words]
    out = {}
    for t, word in enumerate(aligned.target_words):
        de = _norm(word)
        linked = {s for s, en in enumerate(source) if (en, de) in pairs}
        if linked:
            out[t] = linked
    return out


def anchored_scores(outputs, all_anchors, links_of) -> dict:
    """Anchored precision and pair recall of the links `links_of(i)` of each output i."""
    hits = total = pairs_linked = pairs_total = words = 0
    for i, found in enumerate(all_anchors):
        if not found:
            continue
        links = set(links_of(i))
        for t, sources in found.items():
            words += 1
            from_t = [s for s, tt in links if tt == t]
            total += len(from_t)
            hits += sum(s in sources for s in from_t)
            pairs_total += len(sources)
            pairs_linked += sum((s, t) in links for s in sources)
    return {"anchored_words": words, "anchored_precision": percent(hits, total),
            "pair_recall": percent(pairs_linked, pairs_total), "links_from_anchored_words": total}  # fmt: skip


def diagonal_links(aligned) -> list[tuple[int, int]]:
    """The baseline: target word t linked to the source word at the same relative position."""
    s, t = len(aligned.source_words), len(aligned.target_words)
    return [(min(s - 1, round(k * s / t)), k) for k in range(t)] if s and t else []


def methods_of(model) -> list[str]:
    layers = model.config.num_decoder_layers
    supervised = ["supervised"] if supervised_head(model.config) else []
    return [*supervised, *(f"{shift}{name}" for name in ["mean", *(f"layer{k}" for k in range(layers))]
                           for shift in ("", "shift-"))]  # fmt: skip


# --- silver reference: eflomal, symmetrized -------------------------------------------------------------------


def aer(predicted: list[set], reference: list[set]) -> dict:
    """AER with every reference link sure: 1 - 2|A & S| / (|A| + |S|); and precision, recall."""
    both = sum(len(a & s) for a, s in zip(predicted, reference, strict=True))
    found, wanted = sum(map(len, predicted)), sum(map(len, reference))
    aer = 100 - percent(2 * both, found + wanted)
    return {"aer": round(aer, 1), "precision": percent(both, found), "recall": percent(both, wanted)}


def eflomal_reference(train_pairs, test_pairs) -> dict | None:
    """eflomal's links of `test_pairs` (token lists), aligned with `train_pairs`: forward, backward, gdfa,
    intersection; None where eflomal cannot be imported."""
    try:
        require_eflomal()
    except ImportError:
        return None
    forward, backward = (links[len(train_pairs) :] for links in eflomal_links(list(train_pairs) + list(test_pairs)))
    gdfa = [grow_diag_final_and(f, b, len(s), len(t)) for f, b, (s, t) in zip(forward, backward, test_pairs,
                                                                                strict=True)]  # fmt: skip
    return {"forward": forward, "backward": backward, "gdfa": gdfa,
            "intersection": [f & b for f, b in zip(forward, backward, strict=True)]}  # fmt: skip


# --- markup ---------------------------------------------------------------------------------------------------


def markup_test(sources, references, pairs) -> list[tuple[str, str, str]]:
    """(source with one dictionary word wrapped in <b>...</b>, that word, its German term) per sentence that has
    one: the English word of the source paired with the longest German word of the reference (then alphabetical)."""
    rows = []
    for source, reference in zip(sources, references, strict=True):
        in_reference = {w.lower(): w for w in re.findall(r"\w+", reference)}
        found = sorted({(de, en) for en in {_norm(w) for w in source.split()} for de in in_reference
                        if (en, de) in pairs}, key=lambda p: (-len(p[0]), p))  # fmt: skip
        if not found:
            continue
        de, en = found[0]
        match = re.search(rf"(?i)\b{re.escape(en)}\b", source)
        if match is None:
            continue
        marked = f"{source[: match.start()]}<b>{match.group(0)}</b>{source[match.end() :]}"
        rows.append((marked, match.group(0), in_reference[de]))
    return rows


def measure_markup(model, tokenizer, rows, method) -> dict:
    marked = [row[0] for row in rows]
    report = ControlReport()
    start = time.perf_counter()
    outputs = translate(model, tokenizer, marked, batch_size=BATCH, markup="xml",
                        constraints=[[(row[1], row[2])] for row in rows], report=report,
                        alignment_method=method)  # fmt: skip
    seconds = time.perf_counter() - start
    inside = formed = same = has_term = 0
    examples = []
    for (source, _, term), output in zip(rows, outputs, strict=True):
        formed += well_formed(output)
        same += sorted(tags(output)) == sorted(tags(source))
        present = re.search(rf"(?i)\b{re.escape(term)}\b", re.sub(r"<[^>]*>", "", output)) is not None
        has_term += present
        bold = " ".join(re.findall(r"<b>(.*?)</b>", output))
        ok = re.search(rf"(?i)\b{re.escape(term)}\b", bold) is not None
        inside += ok
        if len(examples) < 8:
            examples.append({"source": source, "term": term, "output": output, "term_inside": ok})
    n = len(rows)
    return {"lines": n, "term_inside_tag": percent(inside, n),
            "term_inside_tag_of_lines_with_term": percent(inside, has_term), "term_in_output": percent(has_term, n),
            "well_formed": percent(formed, n), "same_tags": percent(same, n),
            "unmet_constraints": len(report.unmet), "seconds": round(seconds, 1), "examples": examples}  # fmt: skip


def markup_speed(model, tokenizer, rows, repeats: int) -> dict:
    """Section 7: the test split's lines with a `<b>` pair (section 5's, no constraints) translated with
    `markup="xml"` against their text without the tags translated with `alignments="hard"` (what the markup stage
    searches), interleaved rounds, medians; `cost_percent`: how much slower markup is."""
    marked = [row[0] for row in rows]
    plain = {line: parse_markup(line).text for line in marked}
    sides = {"alignments": lambda lines: translate(model, tokenizer, [plain[line] for line in lines], batch_size=BATCH,
                                                   alignments="hard"),
             "markup": partial(translate, model, tokenizer, batch_size=BATCH, markup="xml")}  # fmt: skip
    table = run_sides(sides, marked, [plain[line] for line in marked], max(repeats, 1), "alignments")[0]
    return {"lines": len(marked), **table,
            "cost_percent": round(100 * (1 / table["markup"]["ratio_to_alignments"] - 1), 1)}  # fmt: skip


def _pair_words(text: str) -> dict[tuple[str, int], set[int]]:
    """(opening tag, its occurrence) -> the indices of the plain-text words inside that pair."""
    plan = parse_markup(text)
    spans = [m.span() for m in re.finditer(r"\S+", plan.text)]
    out, seen = {}, collections.Counter()
    for pair in plan.pairs:
        seen[pair.open] += 1
        out[(pair.open, seen[pair.open])] = {k for k, (a, b) in enumerate(spans) if a < pair.end and b > pair.start}
    return out


def _categories(plan, index: int) -> list[str]:
    """The kinds of a hand-marked pair, for the misses by kind: where its content sits in the line, its nesting,
    its width, and the line's number of pairs."""
    pair, words = plan.pairs[index], [m.span() for m in re.finditer(r"\S+", plan.text)]
    inside = [k for k, (a, b) in enumerate(words) if a < pair.end and b > pair.start]
    kinds = ["line_start" if inside and inside[0] == 0 else "line_end" if inside and inside[-1] == len(words) - 1
             else "middle", "multiword" if len(inside) > 1 else "oneword",
             "one_pair" if len(plan.pairs) == 1 else "two_or_more_pairs"]  # fmt: skip
    if pair.parent is not None or any(other.parent == index for other in plan.pairs):
        kinds.append("nested")
    if " " in pair.open.strip("<>"):
        kinds.append("attributes")
    return kinds


def forced_spans(model, tokenizer, rows, method, rules=SPAN_RULES) -> dict:
    """Span precision against the hand-marked references (module docstring, 6), per span rule: the model aligns
    (source, reference) teacher-forced once, `restore` puts the source's tags into the reference under each rule,
    each pair compared with the hand-marked; the misses counted by kind (`_categories`) and by the line's set."""
    start = model.config.decoder_start_token_id
    results = {}
    aligned_rows = []
    for row in rows:
        plan, gold_plan = parse_markup(row["source"]), parse_markup(row["reference"])
        source_ids = tokenizer(plan.text)["input_ids"]
        target_ids = tokenizer(text_target=gold_plan.text)["input_ids"]
        aligned = align_outputs(model, tokenizer, [plan.text], [source_ids], torch.tensor([[start, *target_ids]]),
                                "hard", method)[0]  # fmt: skip
        aligned_rows.append((row, plan, gold_plan, aligned))
    for rule in rules:
        exact = pairs = found = correct = wanted = skipped = 0
        misses, kinds = [], collections.Counter()
        for row, plan, gold_plan, aligned in aligned_rows:
            output = restore(plan, aligned, rule)
            if len(parse_markup(output).text.split()) != len(gold_plan.text.split()):  # not the reference's words
                skipped += 1
                continue
            got, gold = _pair_words(output), _pair_words(row["reference"])
            for index, (key, words) in enumerate(gold.items()):
                pairs += 1
                mine = got.get(key, set())
                exact += mine == words
                found, correct, wanted = found + len(mine), correct + len(mine & words), wanted + len(words)
                for kind in [row.get("set", "sentence"), *_categories(gold_plan, index)]:
                    kinds[kind, "pairs"] += 1
                    kinds[kind, "exact"] += mine == words
                if mine != words and len(misses) < 12:
                    misses.append({"source": row["source"], "reference": row["reference"], "restored": output})
        by_kind = {kind: f"{kinds[kind, 'exact']}/{kinds[kind, 'pairs']}" for kind, _ in sorted(kinds)}
        results[rule] = {"lines": len(aligned_rows) - skipped, "lines_skipped": skipped, "pairs": pairs,
                         "exact_span": percent(exact, pairs), "word_precision": percent(correct, found),
                         "word_recall": percent(correct, wanted), "exact_by_kind": by_kind,
                         "misses": misses}  # fmt: skip
    return results


def span_precision(model, tokenizer, rows, method) -> dict:
    """The span rule chosen on the held-out set's dev part (best exact span share, the default rule on a tie) and
    measured on its test part, the split each hand-marked line records (`split`)."""
    dev = forced_spans(model, tokenizer, [r for r in rows if r.get("split") == "dev"], method)
    chosen = max(SPAN_RULES, key=lambda rule: (dev[rule]["exact_span"], rule == SPAN_RULE))
    test = forced_spans(model, tokenizer, [r for r in rows if r.get("split") == "test"], method, [chosen])[chosen]
    return {"dev": {rule: {k: v for k, v in found.items() if k != "misses"} for rule, found in dev.items()},
            "chosen_on_dev": chosen, "default_rule": SPAN_RULE, "test": test}  # fmt: skip


def measure_heldout(model, tokenizer, rows, method) -> dict:
    """The held-out markup set's shares (module docstring, 6)."""
    sources = [row["source"] for row in rows]
    catcher = logging.handlers.BufferingHandler(capacity=10**9)  # the warnings, kept
    catcher.setLevel(logging.WARNING)
    logging.getLogger("vaswani_mt.inference.markup").addHandler(catcher)
    try:
        outputs = translate(model, tokenizer, sources, batch_size=BATCH, markup="xml", alignment_method=method)
    finally:
        logging.getLogger("vaswani_mt.inference.markup").removeHandler(catcher)
    warned = [record.getMessage() for record in catcher.buffer]
    plain_lines = [i for i, row in enumerate(rows) if row["kind"] == "plain"]
    unchanged = translate(model, tokenizer, [sources[i] for i in plain_lines], batch_size=BATCH)
    counts = collections.Counter()
    failures = collections.defaultdict(list)

    def check(name: str, ok: bool, i: int) -> None:
        counts[name, "lines"] += 1
        counts[name, "ok"] += ok
        if not ok and len(failures[name]) < 6:
            failures[name].append({"source": sources[i], "output": outputs[i]})

    for i, (row, output) in enumerate(zip(rows, outputs, strict=True)):
        plan = parse_markup(row["source"])
        if plan.broken:
            check("broken_line_warned", any(m.startswith(f"line {i + 1}: broken markup") for m in warned), i)
            continue
        if not plan.marked:
            continue
        check("well_formed", well_formed(output, html=plan.html), i)
        for name, of in (("tags", tags), ("placeholders_and_literals", placeholders), ("comments", comments)):
            if of(row["source"]):
                check(
                    f"{name}_exactly_once", collections.Counter(of(output)) == collections.Counter(of(row["source"])), i
                )
        edges = re.fullmatch(rf"({_VOID_TAGS})?.*?({_VOID_TAGS})?", row["source"].strip(), re.DOTALL)
        if edges[1] or edges[2]:  # the line starts or ends with void tags: the output too, the same
            ok = output.startswith((edges[1] or "").strip()) and output.endswith((edges[2] or "").strip())
            check("void_tags_at_edges_stay", ok, i)
        if plan.strays:
            check("stray_warned", any(m.startswith(f"line {i + 1}: a ") for m in warned), i)
    for k, i in enumerate(plain_lines):
        check("plain_lines_unchanged", outputs[i] == unchanged[k], i)
    names = dict.fromkeys(name for name, _ in counts)
    result = {name: {"share": percent(counts[name, "ok"], counts[name, "lines"]),
                     "lines": counts[name, "lines"]} for name in names}  # fmt: skip
    result["examples"] = [{"source": s, "output": o} for s, o in zip(sources[::12], outputs[::12], strict=True)]
    result["failures"] = dict(failures)
    return result


def main() -> None:
    parser = command_parser(__doc__)
    parser.add_argument("model", help="the main job's output folder (its averaged model)")
    parser.add_argument("--eflomal", action="store_true", help="also the silver AER against eflomal (if installed)")
    parser.add_argument("--repeats", type=int, default=3, help="rounds of the speed comparison (0: none)")
    parser.add_argument("--sentences", type=int, default=None, help="only the first N test sentences")
    parser.add_argument("--markup_heldout", help="only the markup: this held-out set (6) and the test split's (5)")
    parser.add_argument("--markup_speed", action="store_true",
                        help="only the speed of markup=xml against alignments=hard (7), --repeats rounds")  # fmt: skip
    args = parser.parse_args()
    record = MachineRecord()
    model, tokenizer = load_for_inference(args.model)
    sources, references = split_pairs("test", args.sentences)
    pairs = dictionary_pairs(_fetch_ding_dictionary(cache_dir() / "ding"))
    result = {"model": args.model, "native_bf16": native_bf16(), "sentences": len(sources),
              "dictionary_pairs": len(pairs), "default_method": default_method(model)}  # fmt: skip
    if args.markup_speed:
        result["markup_speed"] = markup_speed(model, tokenizer, markup_test(sources, references, pairs), args.repeats)
        record.report(result, args.json)
        return
    if args.markup_heldout:
        rows = [json.loads(line) for line in Path(args.markup_heldout).read_text(encoding="utf-8").splitlines()]
        method = default_method(model)
        result["heldout"] = {"lines": len(rows), **measure_heldout(model, tokenizer, rows, method)}
        result["heldout"]["span_precision"] = span_precision(model, tokenizer, [r for r in rows if "reference" in r],
                                                             method)  # fmt: skip
        result["markup"] = measure_markup(model, tokenizer, markup_test(sources, references, pairs), method)
        record.report(result, args.json)
        return

    start = time.perf_counter()
    aligned = translate(model, tokenizer, sources, batch_size=BATCH, alignments="hard")
    result["aligned_translation_seconds"] = round(time.perf_counter() - start, 1)
    found = [anchors(a, pairs) for a in aligned]
    result["sentences_with_anchors"] = sum(map(bool, found))
    rows = {"diagonal baseline": anchored_scores(aligned, found, lambda i: diagonal_links(aligned[i]))}
    by_method = {}
    for method in methods_of(model):
        by_method[method] = [realign(a, method) for a in aligned]
        rows[method] = anchored_scores(aligned, found, lambda i, m=method: by_method[m][i].links)
    result["methods"] = rows
    best = max(by_method, key=lambda m: rows[m]["anchored_precision"])
    result["best_method"] = best
    variants = {}
    for merge in ("sum", "mean"):
        again = [realign(a, best, merge=merge) for a in aligned]
        for rule in ("argmax", "intersect", 0.3, 0.5):
            variants[f"{merge}, {rule}"] = anchored_scores(
                aligned, found, lambda i, r=rule, g=again: hard_links(g[i].soft, r)
            )
    result["rules_and_merges_of_best"] = variants

    if args.eflomal:
        split = [([w.lower() for w in a.source_words], [w.lower() for w in a.target_words]) for a in aligned]
        train = [(s.lower().split(), t.lower().split()) for s, t in zip(*split_pairs("train"), strict=True)]
        start = time.perf_counter()
        silver = eflomal_reference(train, split)
        if silver is None:
            result["silver_aer"] = "eflomal is not installed (pip install eflomal): not measured"
        else:
            reference = silver["gdfa"]
            table = {m: aer([set(a.links) for a in by_method[m]], reference) for m in by_method}
            table["diagonal baseline"] = aer([set(diagonal_links(a)) for a in aligned], reference)
            for name in ("forward", "backward", "intersection"):
                table[f"eflomal {name} (scale)"] = aer(silver[name], reference)
            result["silver_aer"] = {"reference": "eflomal grow-diag-final-and of (test source, our output), aligned "
                                    "with the training split: a silver reference, not gold",
                                    "seconds": round(time.perf_counter() - start, 1), "table": table}  # fmt: skip

    if args.repeats:
        sides = {"plain": partial(translate, model, tokenizer, batch_size=BATCH),
                 "alignments": partial(translate, model, tokenizer, batch_size=BATCH, alignments="hard")}  # fmt: skip
        rows = run_sides(sides, sources, references, args.repeats, "plain")[0]
        result["speed"] = {**rows, "cost_percent": round(100 * (1 / rows["alignments"]["ratio_to_plain"] - 1), 1)}

    result["markup"] = measure_markup(model, tokenizer, markup_test(sources, references, pairs), default_method(model))
    record.report(result, args.json)


if __name__ == "__main__":
    main()
