#!/usr/bin/env python
"""Issue 52, item 2: the ceiling of refill (continuous batching) on the test split, measured. One translate() of the
split with finished sentences leaving (the model's search, batches of 16, float32, one thread), as it runs today,
records each search step: its rows and its seconds (from one step's start to the next's: the decoder, the search's
bookkeeping and the leaving), and the steps each sentence stays. Refill is then the same sentences through a pool
of `batch_size` places that a waiting sentence of the chunk takes as soon as one leaves (each sentence keeps its
steps): its steps and rows, and its time at today's measured seconds for a step of that many rows. Free joins:
the encoder runs, cache padding and longer self-attention keys that refill adds are not counted, so this is an
upper bound of what it could save.

    python benchmarks/refill_ceiling.py --model outputs/ding-cpu --repeats 3
"""

from __future__ import annotations

import copy
import itertools
import statistics
import time
from collections import defaultdict

import torch
from speed_common import MachineRecord, command_parser, split_pairs

from vaswani_mt.inference.loading import load_for_inference
from vaswani_mt.inference.translate import translate
from vaswani_mt.model import beam_search_vaswani as search


def record_steps(model, tokenizer, sources, batch_size: int):
    """One translate(): seconds, [(rows, seconds) of each step but each batch's last], [steps of each sentence],
    [[rows of each step] of each batch]."""
    step, marks, stays, batches = search._Decoder.next_log_probs, [], [], []

    def marked(decoder, sequences, generated, *rest):
        if generated == 1:
            batches.append([])
            stays.append(defaultdict(int))
        for sentence in decoder.sentences.tolist():
            stays[-1][sentence] += 1
        batches[-1].append(sequences.shape[0] * sequences.shape[1])
        marks.append((generated, batches[-1][-1], time.perf_counter()))
        return step(decoder, sequences, generated, *rest)

    search._Decoder.next_log_probs = marked
    try:
        start = time.perf_counter()
        translate(model, tokenizer, sources, batch_size=batch_size)
        seconds = time.perf_counter() - start
    finally:
        search._Decoder.next_log_probs = step
    timed = [(rows, later[2] - at) for (_, rows, at), later in itertools.pairwise(marks) if later[0] > 1]
    return seconds, timed, [n for batch in stays for n in batch.values()], batches


def pool(stays: list[int], places: int, beams: int) -> list[int]:
    """The rows of each step when sentences (in batch order, each staying `stays[i]` steps) take any of `places`
    places as soon as it is free."""
    waiting, running, rows = list(stays), [], []
    while waiting or running:
        while waiting and len(running) < places:
            running.append(waiting.pop(0))
        rows.append(beams * len(running))
        running = [left - 1 for left in running if left > 1]
    return rows


def main(argv=None) -> dict:
    parser = command_parser(__doc__)
    parser.add_argument("--model", required=True, help="a trained model folder (the main job's: outputs/ding-cpu)")
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--lines", type=int, default=None, help="the test split's first lines (default: all 584)")
    parser.add_argument("--repeats", type=int, default=3, help="translate() runs whose step times are pooled")
    parser.add_argument("--prototype", action="store_true", help="time the refill prototype against today's search")
    parser.add_argument("--profile", action="store_true", help="with --prototype: one profiled run of each")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    record = MachineRecord()
    model, tokenizer = load_for_inference(args.model, device="cpu")
    sources, references = split_pairs("test", args.lines)
    if args.prototype:
        result = prototype(model, tokenizer, sources, references, args.batch_size, args.repeats, args.profile)
        return record.report(result, args.json)
    beams = model.generation_config.num_beams
    record_steps(model, tokenizer, sources[: args.batch_size], args.batch_size)  # warm-up
    runs = [record_steps(model, tokenizer, sources, args.batch_size) for _ in range(args.repeats)]
    by_rows = defaultdict(list)
    for _, timed, _, _ in runs:
        for rows, seconds in timed:
            by_rows[rows].append(seconds)
    step_s = {rows: statistics.median(times) for rows, times in sorted(by_rows.items())}
    _, _, stays, batches = runs[0]
    today = [rows for batch in batches for rows in batch]
    refill = pool(stays, args.batch_size, beams)
    full = beams * args.batch_size

    def seconds(steps: list[int]) -> float:
        return sum(step_s[min(step_s, key=lambda measured: abs(measured - rows))] for rows in steps)

    total = statistics.median(run[0] for run in runs)
    saved = seconds(today) - seconds(refill)
    result = {
        "translate_seconds (median)": round(total, 2),
        "steps": {"today": len(today), "refill": len(refill)},
        "decoder_rows": {"today": sum(today), "refill": sum(refill)},
        "steps_below_full": {
            "today": round(sum(r < full for r in today) / len(today), 3),
            "refill": round(sum(r < full for r in refill) / len(refill), 3),
        },
        "step_ms_by_rows (median)": {rows: round(s * 1e3, 3) for rows, s in step_s.items()},
        "steps_seconds at those": {"today": round(seconds(today), 2), "refill": round(seconds(refill), 2)},
        "ceiling": {
            "seconds_saved": round(saved, 2),
            "share_of_translate": round(saved / total, 3),
            "speedup_at_most": round(total / (total - saved), 3),
        },
    }
    return record.report(result, args.json)


# The prototype: the plain search (the model's saved one: early_stopping=True, per-sentence limits, no controls)
# over a whole chunk, `places` sentences at a time, each row on its own clock (`gen`, (B, 1)).
def _encode_groups(model, batches):
    """Each sentence's encoder states and mask, the encoder run on today's batches of 16 (the same inputs)."""
    states, masks = [], []
    for batch in batches:
        out = model.get_encoder()(batch["input_ids"], attention_mask=batch["attention_mask"])[0]
        for row in range(out.shape[0]):
            length = int(batch["attention_mask"][row].sum())
            states.append(out[row, :length]), masks.append(length)
    return states, masks


def _pad_seq(tensor, length: int, dim: int, left: bool = False):
    missing = length - tensor.shape[dim]
    if missing <= 0:
        return tensor
    shape = list(tensor.shape)
    shape[dim] = missing
    pad = tensor.new_zeros(shape)
    return torch.cat((pad, tensor) if left else (tensor, pad), dim=dim)


def _cross_keys(model, states):
    """Each decoder layer's cross-attention keys and values of encoder `states` (what the model's first step caches)."""
    out = []
    for layer in model.get_decoder().layers:
        attn = layer.cross_attn
        out.append((attn._heads(attn.k_proj(states), attn.d_k), attn._heads(attn.v_proj(states), attn.d_v)))
    return out


def _join_cache(cache, cross, rows: int):
    """`cache` with `rows` joining rows after its own: no self-attention keys of theirs yet (zeros, masked), their
    cross-attention keys and values `cross` (per layer), both padded to one length."""
    for layer in cache.self_attention_cache.layers:
        shape = (rows, *layer.keys.shape[1:])
        layer.keys = torch.cat([layer.keys, layer.keys.new_zeros(shape)])
        layer.values = torch.cat([layer.values, layer.values.new_zeros(shape)])
    for layer, (keys, values) in zip(cache.cross_attention_cache.layers, cross, strict=True):
        length = max(layer.keys.shape[2], keys.shape[2])
        layer.keys = torch.cat([_pad_seq(layer.keys, length, 2), _pad_seq(keys, length, 2)])
        layer.values = torch.cat([_pad_seq(layer.values, length, 2), _pad_seq(values, length, 2)])


def _join(model, state: dict, joining: list[int], states, lengths, start_config, eos):
    """The sentences `joining` take their places: their rows appended to every per-row state (and the cache)."""
    k = start_config.num_beams
    j_len = max(lengths[i] for i in joining)
    j_enc = torch.stack([_pad_seq(states[i], j_len, 0) for i in joining]).repeat_interleave(k, dim=0)
    j_mask = (torch.arange(j_len)[None] < torch.tensor([lengths[i] for i in joining])[:, None]).long()
    j_mask = j_mask.repeat_interleave(k, dim=0)
    running, finished = search._start(len(joining), start_config, eos, "cpu")
    if state["ids"].numel():
        with torch.profiler.record_function("refill: caches joined"):
            if state["cache"] is not None:
                _join_cache(state["cache"], _cross_keys(model, j_enc), j_enc.shape[0])
            enc, mask = state["enc"], state["enc_mask"]
            length = max(j_len, enc.shape[1])
            j_enc = torch.cat([_pad_seq(enc, length, 1), _pad_seq(j_enc, length, 1)])
            j_mask = torch.cat([_pad_seq(mask, length, 1), _pad_seq(j_mask, length, 1)])
            running = type(running)(*(torch.cat(p) for p in zip(state["running"], running, strict=True)))
            finished = type(finished)(*(torch.cat(p) for p in zip(state["finished"], finished, strict=True)))
    state.update(enc=j_enc, enc_mask=j_mask, running=running, finished=finished,
                 ids=torch.cat([state["ids"], torch.tensor(joining)]),
                 gen=torch.cat([state["gen"], torch.ones(len(joining), 1, dtype=torch.long)]))  # fmt: skip


def refill_search(model, batches, places: int):
    """Best hypothesis (tokens, GNMT score) of every sentence of `batches` (today's, in order), by refill: joining
    sentences' first step is in the running rows' forward (their cross-attention keys projected as they join)."""
    from transformers.modeling_outputs import BaseModelOutput

    from vaswani_mt.model.generation_vaswani import sentence_limits

    config = model.generation_config
    k, alpha, eos_id = config.num_beams, float(config.length_penalty), config.eos_token_id
    eos = torch.tensor([eos_id])
    states, lengths = _encode_groups(model, batches)
    limits = sentence_limits(config.max_len_a, config.max_len_b, torch.tensor(lengths))
    width = int(limits.max()) + 1
    setup = search._Setup(num_beams=k, keep=2 * k, eos=eos, max_length=width, alpha=alpha, early_stopping=True,
                          stopping_criteria=None)  # fmt: skip
    decoder_stack = model.get_decoder()
    embed, scale = decoder_stack.embed_tokens, decoder_stack.embed_scale
    table = decoder_stack._sinusoids(0, width + 1, states[0])
    plain = search._PlainChoice(k, setup.keep)
    start_config = copy.deepcopy(config)
    start_config.max_length = width
    waiting, results = list(range(len(states))), {}
    state = {"cache": None, "ids": torch.zeros(0, dtype=torch.long), "gen": torch.zeros(0, 1, dtype=torch.long)}
    while waiting or state["ids"].numel():
        joining, waiting = waiting[: places - state["ids"].numel()], waiting[places - state["ids"].numel() :]
        if joining:
            _join(model, state, joining, states, lengths, start_config, eos)
        cache, running, ids, gen = state["cache"], state["running"], state["ids"], state["gen"]
        encoded = BaseModelOutput(last_hidden_state=state["enc"])
        own = gen.repeat_interleave(k, dim=0)  # (R, 1) this step's token, from 1
        with torch.profiler.record_function("refill: the forward"):
            if cache is None:
                start = torch.full((own.shape[0], 1), config.decoder_start_token_id)
                out = model(attention_mask=state["enc_mask"], decoder_input_ids=start, encoder_outputs=encoded,
                            use_cache=True)  # fmt: skip
            else:
                length = cache.self_attention_cache.get_seq_length()
                last = torch.take_along_dim(running.sequences.reshape(-1, width), own - 1, dim=1)
                embeds = embed(last) + ((table[own - 1] - table[length]) / scale)
                self_mask = (torch.arange(length + 1)[None, :] >= length + 1 - own).long()
                out = model(attention_mask=state["enc_mask"], decoder_inputs_embeds=embeds, cache=cache,
                            decoder_attention_mask=self_mask, encoder_outputs=encoded, use_cache=True)  # fmt: skip
        cache = search._cache_of(out)
        log_probs = torch.nn.functional.log_softmax(out.logits[:, -1].float(), dim=-1)
        at_limit = (gen >= limits[ids][:, None]).repeat_interleave(k, dim=0)[:, 0]
        if at_limit.any():
            eos_scores = log_probs[:, eos_id].clone()
            log_probs = log_probs.masked_fill(at_limit[:, None], -float("inf"))
            log_probs[:, eos_id] = torch.where(at_limit, eos_scores, log_probs[:, eos_id])
        totals = log_probs.view(-1, k, log_probs.shape[-1]) + running.scores[:, :, None]
        vocab = totals.shape[-1]
        scores, indices = torch.topk(totals.reshape(totals.shape[0], -1), k=setup.keep)
        beams, tokens = indices // vocab, indices % vocab
        sequences = search._gather(running.sequences, beams)
        sequences.scatter_(2, gen[:, :, None].expand(-1, beams.shape[1], 1), tokens[:, :, None])
        origins = search._gather(running.origins, beams)
        ends = torch.isin(tokens, eos) | (gen >= limits[ids][:, None])
        candidates = search._Candidates(sequences, scores, origins, beams, tokens, ends)
        chosen, finishing = plain.choose(candidates, 0)
        improvable = torch.ones(ids.shape[0], 1, dtype=torch.bool)
        finished = state["finished"]
        finishing_scores = search._finishing_scores(candidates, finishing, finished, improvable, gen, setup)
        finished, _ = search._merge_finished(finished, candidates, finishing_scores, finishing_scores, finishing, k)
        running = candidates.take(chosen)
        improvable = search.can_improve(improvable=improvable, running_scores=running.scores.amax(-1, keepdim=True),
                                        finished_scores=finished.keys, is_finished=finished.done, generated=gen,
                                        longest=width - 1, early_stopping=True, alpha=alpha)  # fmt: skip
        going = improvable[:, 0] & ~finished.done.all(-1) & ~candidates.ends.all(-1)
        beam_idx = search._gather(candidates.beams, chosen) + torch.arange(chosen.shape[0])[:, None] * k
        for row in (~going).nonzero()[:, 0].tolist():
            results[int(ids[row])] = (finished.sequences[row, 0, 1 : 1 + int(gen[row])], float(finished.scores[row, 0]))
        if going.all():
            model.reorder_beam_cache(cache, beam_idx.reshape(-1))
            state.update(cache=cache, running=running, finished=finished, gen=gen + 1)
            continue
        with torch.profiler.record_function("refill: sentences leave"):
            keep = going.nonzero()[:, 0]
            rows = (keep[:, None] * k + torch.arange(k)).reshape(-1)
            cache.reorder_cache(beam_idx[keep].reshape(-1))
            state.update(cache=cache, enc=state["enc"].index_select(0, rows),
                         enc_mask=state["enc_mask"].index_select(0, rows), running=search._rows(running, keep),
                         finished=search._rows(finished, keep), ids=ids[keep], gen=gen[keep] + 1)  # fmt: skip
            if not keep.numel():
                state["cache"] = None
                continue
            stale = cache.self_attention_cache.get_seq_length() - int(state["gen"].max() - 1)
            if stale > 0:  # self-attention columns no row reads any more
                for layer in cache.self_attention_cache.layers:
                    layer.keys, layer.values = layer.keys[:, :, stale:], layer.values[:, :, stale:]
    return [results[i] for i in range(len(states))]


def _until_eos(tokens, eos: int) -> list[int]:
    tokens = tokens.tolist()
    return tokens[: tokens.index(eos) + 1] if eos in tokens else tokens


def _profiled(run) -> dict:
    """One run under torch's profiler: calls and total milliseconds of the prototype's parts and of packing."""
    names = ("mkl::_mkl_reorder_linear_weight", "mkl::_mkl_linear", "aten::cat", "aten::index_select")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        start = time.perf_counter()
        run()
        seconds = time.perf_counter() - start
    return {"seconds (profiled)": round(seconds, 2), **{
        event.key: {"calls": event.count, "ms": round(event.cpu_time_total / 1e3, 1)}
        for event in profile.key_averages() if event.key in names or event.key.startswith("refill:")}}  # fmt: skip


def prototype(model, tokenizer, sources, references, batch_size: int, repeats: int, profile: bool = False) -> dict:
    """Today's search (generate() per batch of `batch_size`, longest first, sentences leaving) against the refill
    prototype over the same batches, paired rounds interleaved: seconds, equal tokens, the largest score difference."""
    import sacrebleu
    from speed_common import interleave

    order = sorted(range(len(sources)), key=lambda i: len(sources[i]), reverse=True)
    batches = [tokenizer([sources[i] for i in order[s : s + batch_size]], return_tensors="pt", padding=True)
               for s in range(0, len(order), batch_size)]  # fmt: skip
    eos, output, found = model.generation_config.eos_token_id, search._output, {}

    def today():
        scores, tokens = [], []
        search._output = lambda finished, *rest: scores.append(finished.scores[:, 0]) or output(finished, *rest)
        try:
            for batch in batches:
                tokens += [_until_eos(row[1:], eos) for row in model.generate(**batch)]
        finally:
            search._output = output
        found["today"] = tokens, torch.cat(scores)

    def refill():
        results = refill_search(model, batches, batch_size)
        found["refill"] = [_until_eos(t, eos) for t, _ in results], torch.tensor([s for _, s in results])

    with torch.no_grad():
        if profile:
            return {name: _profiled(run) for name, run in (("today", today), ("refill", refill))}
        times = interleave({"today": today, "refill": refill}, repeats, warmup=0)
    (a, a_scores), (b, b_scores) = found["today"], found["refill"]
    return {
        "seconds": {name: [round(x, 2) for x in t] for name, t in times.items()},
        "refill_against_today": {
            "median_of_round_ratios": round(
                statistics.median(x / y for x, y in zip(times["today"], times["refill"], strict=True)), 3
            ),
            "ratio_of_medians": round(statistics.median(times["today"]) / statistics.median(times["refill"]), 3),
        },
        "lines_equal": f"{sum(x == y for x, y in zip(a, b, strict=True))}/{len(a)}",
        "bleu (tokenizer.decode, sacreBLEU)": {
            name: round(
                sacrebleu.corpus_bleu(
                    [
                        tokenizer.decode(found[name][0][order.index(i)], skip_special_tokens=True)
                        for i in range(len(sources))
                    ],
                    [references],
                ).score,
                2,
            )
            for name in found
        },
        "max_score_difference": float((a_scores - b_scores).abs().max()),
    }


if __name__ == "__main__":
    main()
