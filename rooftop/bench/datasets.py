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


def pseudo_words(rng: random.Random, n_words: int) -> str:
    """Pronounceable pseudo-words: tokenize like text, never like one long run of bytes."""
    consonants, vowels = "bcdfghjklmnprstvwz", "aeiou"
    out = []
    for _ in range(n_words):
        k = rng.randint(1, 4)
        out.append("".join(rng.choice(consonants) + rng.choice(vowels) for _ in range(k)))
    return " ".join(out)


NO_TOKENS_FIX = ("pass --tokenizer DIR (a local Hugging Face tokenizer of the served model), so prompts can be "
                 "sized on the client")


async def exact_text(tok, rng: random.Random, n_tokens: int, flag: str = "--input-len") -> str:
    """Random text whose token count (with special tokens) is exactly `n_tokens` (`flag`: the flag that
    asked for that length, named in an error)."""
    if n_tokens < 1:
        raise RooftopError(f"{flag} {n_tokens} is too small", f"use {flag} 1 or more")
    special = await tok.count("", True)  # BOS and friends that every encode adds
    body_target = n_tokens - special
    if body_target < 1:
        raise RooftopError(
            f"{flag} {n_tokens} leaves no room for text after {special} special token(s)",
            f"use {flag} {special + 1} or more",
        )
    text = pseudo_words(rng, body_target + 8)
    got = await tok.count(text, False)
    while got < body_target:
        more = text + " " + pseudo_words(rng, body_target)
        grown = await tok.count(more, False)
        if grown <= got:  # more text, no more tokens: the tokenizer does not count this text
            raise RooftopError(f"the tokenizer counts {grown} tokens in {len(more)} characters of text: prompts "
                               "cannot be sized by it", NO_TOKENS_FIX)
        text, got = more, grown
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
            pool = await tok.encode(pseudo_words(rng, (body + 2) * n), False)
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
    if prefix_len < 1:
        raise RooftopError(f"--prefix-len {prefix_len}: --dataset prefix shares a prefix of at least 1 token",
                           f"e.g. --prefix-len {max(1, input_len // 2)}")
    rng = random.Random(seed)
    prefix = await exact_text(tok, rng, prefix_len, "--prefix-len")
    special = await tok.count("", True)
    out = []
    for i in range(n):
        suffix = await exact_text(tok, random.Random(seed * 1_000_003 + i), input_len - prefix_len + special,
                                  "--input-len minus --prefix-len,")
        text = prefix + " " + suffix
        out.append(Prompt(text, await tok.count(text, True), output_len))
    return out


def _pair(entry) -> tuple[str, str] | str | None:
    """(question, answer) of one dataset entry, None where it has fewer than two turns, or why it is not a
    conversation. ShareGPT: {"conversations": [{"from", "value"}, ...]}; OpenAI: {"messages": [{"role",
    "content"}, ...]} (the first user message and the reply after it)."""
    if not isinstance(entry, dict):
        return f"a {type(entry).__name__}, not an object"
    if "conversations" in entry:
        turns, key = entry["conversations"], "value"
    elif "messages" in entry:
        turns, key = entry["messages"], "content"
        if isinstance(turns, list) and all(isinstance(t, dict) for t in turns):
            first = next((i for i, t in enumerate(turns) if t.get("role") == "user"), None)
            turns = turns[first:] if first is not None else []
    else:
        return "no \"conversations\" (or \"messages\") list"
    if not isinstance(turns, list):
        return f"its conversation is a {type(turns).__name__}, not a list of turns"
    for t in turns[:2]:
        if not isinstance(t, dict):
            return f"a turn is a {type(t).__name__}, not an object with a \"{key}\""
        if not isinstance(t.get(key), str):
            return f"a turn's \"{key}\" is {type(t.get(key)).__name__}, not text"
    if len(turns) < 2:
        return None
    return turns[0][key], turns[1][key]


def read_entries(p: Path) -> list:
    """A JSON list, or JSON Lines (one object a line)."""
    try:
        text = p.read_text()
    except UnicodeDecodeError as exc:
        raise RooftopError(f"{p} is not UTF-8 text ({exc})", "use a ShareGPT-format JSON list") from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        try:
            return [json.loads(line) for line in text.splitlines() if line.strip()]
        except json.JSONDecodeError:
            raise RooftopError(f"{p} is not valid JSON, nor JSON Lines ({exc})",
                               "use a ShareGPT-format JSON list (or one conversation object a line)") from exc
    if not isinstance(data, list):
        raise RooftopError(f"{p} holds a JSON {type(data).__name__}, not a list of conversations",
                           "use a ShareGPT-format JSON list of {\"conversations\": [...]} objects")
    return data


async def sharegpt_prompts(
    tok, path: str | Path, n: int, seed: int, output_len: int | None, max_input_len: int = 4096,
    max_model_len: int | None = None, dropped: dict | None = None,
) -> list[Prompt]:
    """First human turn of each conversation as the prompt; output length from the reply (or fixed).

    The usual filter drops prompts under 4 tokens or over `max_input_len`, and answers under 4 tokens
    where the answer sets the output length (a fixed `output_len` is taken as asked); with
    `max_model_len` (the server's context), a prompt whose tokens plus its output exceed it. `dropped`,
    when given, gets the count of each."""
    p = Path(path)
    if not p.is_file():
        raise RooftopError(f"ShareGPT file {p} not found", "pass --dataset-path to a local ShareGPT JSON file")
    data = read_entries(p)
    pairs, bad = [], []
    for i, entry in enumerate(data):
        got = _pair(entry)
        if isinstance(got, str):
            bad.append((i, got))
        elif got is not None:
            pairs.append(got)
    if bad:
        i, why = bad[0]
        raise RooftopError(f"{len(bad)} of {len(data)} entries of {p} are not conversations (entry {i}: {why})",
                           "use ShareGPT's format, a list of {\"conversations\": [{\"from\": \"human\", \"value\": "
                           "TEXT}, {\"from\": \"gpt\", \"value\": TEXT}]} (or OpenAI {\"messages\": [...]}), as JSON "
                           "or one object a line")
    if not pairs:
        raise RooftopError(f"{p} holds no conversations of two turns or more",
                           "use a list of {\"conversations\": [...]} objects")
    random.Random(seed).shuffle(pairs)
    counts = {"short_or_long": 0, "over_context": 0}
    out: list[Prompt] = []
    for question, answer in pairs:
        if len(out) == n:
            break
        in_len = await tok.count(question, True)
        out_len = output_len or await tok.count(answer, False)
        if in_len < 4 or in_len > max_input_len or (not output_len and out_len < 4):
            counts["short_or_long"] += 1
            continue  # the usual ShareGPT filter: drop trivial and over-long turns
        if max_model_len and in_len + out_len > max_model_len:
            counts["over_context"] += 1
            continue  # the server would refuse it: a request that cannot succeed measures nothing
        out.append(Prompt(question, in_len, out_len))
    if dropped is not None:
        dropped.update(counts)
    if not out:
        context = (f", {counts['over_context']} longer than the server's context ({max_model_len} tokens, prompt "
                   "and output)" if max_model_len else "")
        raise RooftopError(f"no usable conversations in {p}: {counts['short_or_long']} with a prompt (or an answer "
                           f"that sets the output length) under 4 tokens, or a prompt over {max_input_len}{context}",
                           "check the file, or fix the output length with --output-len N")
    if len(out) < n:
        # Reuse in order: a level of N requests always gets N prompts, reproducibly.
        out = [out[i % len(out)] for i in range(n)]
    return out
