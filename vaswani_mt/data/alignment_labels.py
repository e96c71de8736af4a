"""Word-alignment labels of the training split for a supervised alignment head (Garg et al. 2019, "Jointly Learning
to Align and Translate", §4): eflomal (an optional package, `pip install eflomal`) aligns the whitespace words of
every pair in both directions, grow-diag-final-and symmetrizes them (Koehn et al. 2005), the links are cached next to
the tokenized data, and each target token gets the source tokens of the source words its word is linked to.

Words and tokens: a text's words are its whitespace-separated words; a token belongs to the word that holds its
first non-space character, by the tokenizer's character offsets (`vaswani_mt.data.words.token_words`; the
training split's labels are made in vaswani_mt/training/alignment_supervision.py, which may import both).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path

INSTALL = "pip install 'vaswani-mt[align]'"  # eflomal


# --- words and tokens -----------------------------------------------------------------------------------------


def token_links(source_index: Sequence[int], target_index: Sequence[int],
                word_links: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:  # fmt: skip
    """(target token, source token) pairs from (source word, target word) links: each token of a target word gets
    every token of the source words linked to it. A target token without a word or a link gets none."""
    tokens_of: dict[int, list[int]] = {}
    for position, word in enumerate(source_index):
        if word >= 0:
            tokens_of.setdefault(word, []).append(position)
    sources_of: dict[int, set[int]] = {}
    for s, t in word_links:
        sources_of.setdefault(t, set()).add(s)
    pairs = []
    for position, word in enumerate(target_index):
        for s in sorted(sources_of.get(word, ())):
            pairs += [(position, j) for j in tokens_of.get(s, ())]
    return pairs


# --- eflomal and symmetrization -------------------------------------------------------------------------------


def require_eflomal():
    """The eflomal module; an ImportError of one line saying how to install it where it is missing."""
    try:
        import eflomal
    except ImportError:
        raise ImportError(f"word-alignment labels need eflomal: {INSTALL}") from None
    return eflomal


def grow_diag_final_and(forward: set, backward: set, source_len: int, target_len: int) -> set:
    """Koehn et al.'s grow-diag-final-and of two directional alignments ((source, target) pairs)."""
    union, links = forward | backward, set(forward & backward)
    neighbours = [(-1, 0), (0, -1), (1, 0), (0, 1), (-1, -1), (-1, 1), (1, -1), (1, 1)]
    added = True
    while added:
        added = False
        for s, t in sorted(links):
            for ds, dt in neighbours:
                s2, t2 = s + ds, t + dt
                if (s2, t2) in union and (s2, t2) not in links:
                    if all(a != s2 for a, _ in links) or all(b != t2 for _, b in links):
                        links.add((s2, t2))
                        added = True
    for direction in (forward, backward):
        for s, t in sorted(direction):
            if all(a != s for a, _ in links) and all(b != t for _, b in links):
                links.add((s, t))
    return links


def eflomal_links(pairs: Sequence[tuple[Sequence[str], Sequence[str]]]) -> tuple[list[set], list[set]]:
    """eflomal's forward and backward links ((source word, target word) sets) of `pairs` (word lists), aligned
    together."""
    eflomal = require_eflomal()
    with tempfile.TemporaryDirectory() as tmp:
        fwd, rev = Path(tmp) / "fwd", Path(tmp) / "rev"
        aligner = eflomal.Aligner()
        aligner.align([" ".join(s) for s, _ in pairs], [" ".join(t) for _, t in pairs],
                      links_filename_fwd=str(fwd), links_filename_rev=str(rev), quiet=True)  # fmt: skip
        forward, backward = ([{tuple(map(int, link.split("-"))) for link in line.split()}
                              for line in path.read_text().splitlines()] for path in (fwd, rev))  # fmt: skip
    return forward, backward


def symmetrized_links(pairs: Sequence[tuple[Sequence[str], Sequence[str]]], cache: Path | None = None) -> list[set]:
    """Grow-diag-final-and of eflomal's two directions for each of `pairs` (word lists, compared lower-cased).
    `cache`: a folder; the links are kept there under a hash of the pairs (written to a temporary file, then
    renamed) and read back by a later call on the same pairs."""
    lowered = [([w.lower() for w in s], [w.lower() for w in t]) for s, t in pairs]
    path = None
    if cache is not None:
        digest = hashlib.sha256("\n".join(f"{' '.join(s)}\t{' '.join(t)}" for s, t in lowered).encode()).hexdigest()
        path = Path(cache) / f"alignment_links-{digest[:16]}.txt"
        if path.exists():
            return [{tuple(map(int, link.split("-"))) for link in line.split()}
                    for line in path.read_text().split("\n")[: len(pairs)]]  # fmt: skip
    forward, backward = eflomal_links(lowered)
    links = [grow_diag_final_and(f, b, len(s), len(t)) for f, b, (s, t) in zip(forward, backward, lowered,
                                                                                 strict=True)]  # fmt: skip
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp") as out:
            out.write("\n".join(" ".join(f"{s}-{t}" for s, t in sorted(row)) for row in links))
        os.replace(out.name, path)
    return links


__all__ = [
    "eflomal_links",
    "grow_diag_final_and",
    "require_eflomal",
    "symmetrized_links",
    "token_links",
]
