"""Seeded, reproducible request sets: random (exact lengths), sharegpt (a local file), prefix (shared)."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from rooftop.errors import RooftopError

DATASETS = ("random", "sharegpt", "prefix")


@dataclass(slots=True)
class Prompt:
    """One request's input text, its length as the client tokenizer counts it, and its output length."""

    text: str
    input_len: int  # tokens, counted by the client tokenizer (with special tokens, as usage counts)
    output_len: int


def _words(rng: random.Random, n_words: int) -> str:
    """Pronounceable pseudo-words: tokenize like text, never like one long run of bytes."""
    consonants, vowels = "bcdfghjklmnprstvwz", "aeiou"
    out = []
    for _ in range(n_words):
        k = rng.randint(1, 4)
        out.append("".join(rng.choice(consonants) + rng.choice(vowels) for _ in range(k)))
    return " ".join(out)


async def exact_text(tok, rng: random.Random, n_tokens: int) -> str:
    """Random text whose token count (with special tokens) is exactly `n_tokens`."""
    if n_tokens < 1:
        raise RooftopError(f"input length {n_tokens} is too small", "use --input-len 1 or more")
    special = await tok.count("", True)  # BOS and friends that every encode adds
    body_target = n_tokens - special
    if body_target < 1:
        raise RooftopError(
            f"input length {n_tokens} leaves no room for text after {special} special token(s)",
            f"use --input-len {special + 1} or more",
        )
    text = _words(rng, body_target + 8)
    while await tok.count(text, False) < body_target:
        text += " " + _words(rng, body_target)
    # Bisect on a character prefix: token counts grow monotonically with the prefix for
    # every practical tokenizer, and this needs only encode, no decode.
    lo, hi = 1, len(text)
    while lo < hi:
        mid = (lo + hi) // 2
        if await tok.count(text[:mid], False) < body_target:
            lo = mid + 1
        else:
            hi = mid
    cut = text[:lo]
    got = await tok.count(cut, True)
    if got != n_tokens:
        # A merge at the cut can leave one token over or under; nudge with single characters.
        for filler in ("a", " a", "."):
            trial = cut[:-1] + filler if got > n_tokens else cut + filler
            if await tok.count(trial, True) == n_tokens:
                return trial
        raise RooftopError(
            f"could not build a prompt of exactly {n_tokens} tokens (got {got})",
            "try another --seed or input length",
        )
    return cut


async def random_prompts(tok, n: int, input_len: int, output_len: int, seed: int) -> list[Prompt]:
    """n distinct prompts of exactly `input_len` tokens, each asking for exactly `output_len` tokens.

    Fast path: one long random text is encoded once and cut into token windows, each decoded and
    re-counted (two tokenizer calls a prompt). A window whose round trip is off by a merge, or a
    tokenizer without decode, falls back to building that prompt by bisection.
    """
    rng = random.Random(seed)
    special = await tok.count("", True)
    body = input_len - special
    pool: list[int] = []
    if body >= 1:
        try:
            pool = await tok.encode(_words(rng, (body + 2) * n), False)
            await tok.decode(pool[:1])
        except LookupError:
            pool = []
    out = []
    for i in range(n):
        window = pool[i * body:(i + 1) * body]
        if len(window) == body:
            text = await tok.decode(window)
            if await tok.count(text, True) == input_len:
                out.append(Prompt(text, input_len, output_len))
                continue
        out.append(Prompt(await exact_text(tok, rng, input_len), input_len, output_len))
    return out


async def prefix_prompts(
    tok, n: int, prefix_len: int, input_len: int, output_len: int, seed: int
) -> list[Prompt]:
    """n prompts sharing one prefix of `prefix_len` tokens, each `input_len` tokens in all (± a merge)."""
    if prefix_len >= input_len:
        raise RooftopError(
            f"--prefix-len {prefix_len} must be smaller than --input-len {input_len}",
            "lower --prefix-len or raise --input-len",
        )
    rng = random.Random(seed)
    prefix = await exact_text(tok, rng, prefix_len)
    special = await tok.count("", True)
    out = []
    for i in range(n):
        suffix = await exact_text(tok, random.Random(seed * 1_000_003 + i), input_len - prefix_len + special)
        text = prefix + " " + suffix
        out.append(Prompt(text, await tok.count(text, True), output_len))
    return out


async def sharegpt_prompts(
    tok, path: str | Path, n: int, seed: int, output_len: int | None, max_input_len: int = 4096
) -> list[Prompt]:
    """First human turn of each conversation as the prompt; output length from the reply (or fixed)."""
    p = Path(path)
    if not p.is_file():
        raise RooftopError(f"ShareGPT file {p} not found", "pass --dataset-path to a local ShareGPT JSON file")
    try:
        data = json.loads(p.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RooftopError(f"{p} is not valid JSON ({exc})", "use a ShareGPT-format JSON list") from exc
    pairs = []
    for conv in data if isinstance(data, list) else []:
        turns = conv.get("conversations") if isinstance(conv, dict) else None
        if not turns or len(turns) < 2:
            continue
        pairs.append((turns[0].get("value", ""), turns[1].get("value", "")))
    if not pairs:
        raise RooftopError(f"{p} holds no conversations", "use a list of {\"conversations\": [...]} objects")
    random.Random(seed).shuffle(pairs)
    out: list[Prompt] = []
    for question, answer in pairs:
        if len(out) == n:
            break
        in_len = await tok.count(question, True)
        out_len = output_len or await tok.count(answer, False)
        if in_len < 4 or out_len < 4 or in_len > max_input_len:
            continue  # the usual ShareGPT filter: drop trivial and over-long turns
        out.append(Prompt(question, in_len, out_len))
    if len(out) < n:
        # Reuse in order: a level of N requests always gets N prompts, reproducibly.
        out = [out[i % len(out)] for i in range(n)] if out else out
    if not out:
        raise RooftopError(f"no usable conversations in {p}", "check the file or lower the filters")
    return out
