"""Prompts of a trace built from its blocks: requests that share a hash id share exactly that block's tokens.

A prompt of N tokens (special tokens counted, as a server's usage counts them) is cut into blocks of
`block_tokens` from its start: block j holds prompt tokens [j x B, (j + 1) x B), so the first holds B minus
the special tokens the tokenizer adds (a BOS). Block j's text is the start of a pseudo-word text seeded by
its key (the trace's hash id; a block no id names gets a key of its own request), the longest start that
the tokenizer counts as exactly the block's tokens. Every block text begins with a space before a word,
where tokenizers split words, so blocks side by side never merge across their boundary: the prompt's
tokens are its blocks' tokens in order, and the whole prompt is counted to check it.
"""

from __future__ import annotations

import random

from rooftop.bench.datasets import NO_TOKENS_FIX, Prompt, pseudo_words
from rooftop.bench.traces import BLOCK_TOKENS, TraceRequest
from rooftop.errors import RooftopError


class BlockTexts:
    """Block texts by (key, tokens), built through a tokenizer (`encode`, `decode`, `count`) and kept."""

    def __init__(self, tok, seed: int, block_tokens: int = BLOCK_TOKENS):
        self.tok, self.seed, self.block_tokens = tok, seed, block_tokens
        self._long: dict[object, tuple[str, list[int]]] = {}  # key -> (its whole text, that text's ids)
        self._texts: dict[tuple[object, int], str] = {}

    async def _whole(self, key: object) -> tuple[str, list[int]]:
        if key not in self._long:
            # str seeds hash with SHA-512: the same key and seed give the same words on every run
            rng = random.Random(f"{self.seed}/{key!r}")
            text = " " + pseudo_words(rng, self.block_tokens + 8)  # at least one token a word
            self._long[key] = text, await self.tok.encode(text, False)
        return self._long[key]

    async def text(self, key: object, n_tokens: int) -> str:
        """The start of key's text that is exactly n_tokens tokens (no special tokens)."""
        if (key, n_tokens) in self._texts:
            return self._texts[key, n_tokens]
        whole, ids = await self._whole(key)
        if len(ids) < n_tokens:
            raise RooftopError(f"the tokenizer counts {len(ids)} tokens in {len(whole)} characters of text: blocks "
                               f"of {n_tokens} tokens cannot be sized by it", NO_TOKENS_FIX)
        cut = None
        try:
            cut = await self.tok.decode(ids[:n_tokens])
        except LookupError:  # a server without /detokenize: bisect on characters instead
            pass
        if cut is None or not whole.startswith(cut) or await self.tok.count(cut, False) != n_tokens:
            cut = await self._bisect(whole, n_tokens)
        self._texts[key, n_tokens] = cut
        return cut

    async def _bisect(self, whole: str, n_tokens: int) -> str:
        """The shortest start of `whole` that counts n_tokens tokens (token counts grow with the prefix)."""
        lo, hi = 1, len(whole)
        while lo < hi:
            mid = (lo + hi) // 2
            if await self.tok.count(whole[:mid], False) < n_tokens:
                lo = mid + 1
            else:
                hi = mid
        cut = whole[:lo]
        if await self.tok.count(cut, False) != n_tokens:
            raise RooftopError(f"no start of a block's text counts exactly {n_tokens} tokens", NO_TOKENS_FIX)
        return cut


def block_layout(input_len: int, special: int, block_tokens: int = BLOCK_TOKENS) -> list[int]:
    """Text tokens of each block of a prompt of input_len tokens, `special` of them added by the tokenizer
    at its start (they sit in the first block)."""
    sizes = []
    for start in range(0, input_len, block_tokens):
        sizes.append(min(block_tokens, input_len - start) - (special if start == 0 else 0))
    return sizes


async def trace_prompts(tok, requests: list[TraceRequest], seed: int, path: str = "<trace>",
                        block_tokens: int = BLOCK_TOKENS) -> list[Prompt]:
    """One prompt per trace request, in order: its own `prompt` as is, else built from blocks (module doc),
    each checked to count exactly its input length."""
    special = await tok.count("", True)
    blocks = BlockTexts(tok, seed, block_tokens)
    out = []
    for r in requests:
        if r.prompt is not None:
            out.append(Prompt(r.prompt, r.input_len or await tok.count(r.prompt, True), r.output_len))
            continue
        sizes = block_layout(r.input_len, special, block_tokens)
        if sizes[0] < 1:
            raise RooftopError(f"{path}, line {r.line}: a prompt of {r.input_len} token(s) leaves no room for text "
                               f"beside the tokenizer's {special} special token(s)",
                               f"give every request at least {special + 1} input tokens")
        ids = r.hash_ids or ()
        parts = [await blocks.text(ids[j] if j < len(ids) else ("own", r.line, j), n) for j, n in enumerate(sizes)]
        text = "".join(parts)
        got = await tok.count(text, True)
        if got != r.input_len:
            raise RooftopError(f"{path}, line {r.line}: its prompt counts {got} tokens, not {r.input_len}: this "
                               "tokenizer merges text across the blocks' boundaries", NO_TOKENS_FIX)
        out.append(Prompt(text, r.input_len, r.output_len))
    return out
