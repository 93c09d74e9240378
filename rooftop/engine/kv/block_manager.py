"""Which KV-cache pages are free and which sequence holds which: the paged cache's bookkeeping.

With prefix caching, a full page whose rows are computed is registered under a hash of its tokens
chained to its parent page's hash, so equal hashes mean equal prefixes. A page (its latent rows and
its index keys alike) is a function of the tokens up to its end, so a new sequence whose first pages
hash the same reuses them instead of computing them. Pages are reference-counted: several sequences
may hold one. A registered page that no sequence holds stays in the cache, and is evicted, least
recently freed first, only when no empty page is left. A page that is not full is never registered,
so a page being written is never shared.
"""

import hashlib
from array import array
from collections import OrderedDict, deque

from rooftop.engine.sequence import PENDING_TOKEN, Sequence


def blocks_for(num_tokens: int, block_size: int) -> int:
    """Pages needed to hold num_tokens tokens."""
    return (num_tokens + block_size - 1) // block_size


def page_hash(parent: bytes, token_ids: list[int]) -> bytes:
    """Hash of a full page: its tokens and its parent page's hash (b"" for the first page)."""
    return hashlib.sha256(parent + array("q", token_ids).tobytes()).digest()


class BlockManager:
    """Hands out physical page ids of the KV cache; a sequence's pages are its block_table, in order."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError(f"num_blocks ({num_blocks}) and block_size ({block_size}) must be positive")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.free_block_ids: deque[int] = deque(range(num_blocks))  # free pages that hold nothing reusable
        self.cached_free: OrderedDict[int, None] = OrderedDict()  # free registered pages, least recently freed first
        self.ref_counts = [0] * num_blocks
        self.block_hash: list[bytes | None] = [None] * num_blocks  # a full page's hash, once its rows are computed
        self.hash_to_block: dict[bytes, int] = {}

    @property
    def num_free_blocks(self) -> int:
        """Pages a sequence can get: empty ones and cached ones no sequence holds (evicted when taken)."""
        return len(self.free_block_ids) + len(self.cached_free)

    @property
    def usage(self) -> float:
        """Fraction of pages held by sequences (0..1)."""
        return 1.0 - self.num_free_blocks / self.num_blocks

    def num_missing_blocks(self, seq: Sequence, num_tokens: int) -> int:
        """Pages seq must still get so that its first num_tokens tokens have a slot."""
        return max(0, blocks_for(num_tokens, self.block_size) - len(seq.block_table))

    def can_grow(self, seq: Sequence, num_tokens: int) -> bool:
        return self.num_missing_blocks(seq, num_tokens) <= self.num_free_blocks

    def grow(self, seq: Sequence, num_tokens: int) -> None:
        """Give seq pages until its first num_tokens tokens have a slot (call can_grow first)."""
        missing = self.num_missing_blocks(seq, num_tokens)
        if missing > self.num_free_blocks:
            raise RuntimeError(f"KV cache: {missing} pages needed, {self.num_free_blocks} free")
        for _ in range(missing):
            seq.block_table.append(self._take_free())

    def shrink(self, seq: Sequence, num_tokens: int) -> None:
        """Give back seq's pages past the ones its first num_tokens tokens need: speculation grew them for
        drafts that were then rejected. They hold no computed full page, so none of them is registered."""
        keep = blocks_for(num_tokens, self.block_size)
        while len(seq.block_table) > keep:
            block_id = seq.block_table.pop()
            self.ref_counts[block_id] -= 1
            if self.ref_counts[block_id] == 0:
                if self.block_hash[block_id] is not None:
                    raise RuntimeError(f"shrink: page {block_id} past token {num_tokens} is registered")
                self.free_block_ids.appendleft(block_id)

    def _take_free(self) -> int:
        """An empty page if there is one, else the least recently freed cached page, its hash dropped."""
        if self.free_block_ids:
            block_id = self.free_block_ids.popleft()
        else:
            block_id, _ = self.cached_free.popitem(last=False)
            del self.hash_to_block[self.block_hash[block_id]]
            self.block_hash[block_id] = None
        self.ref_counts[block_id] = 1
        return block_id

    def cached_prefix(self, seq: Sequence) -> list[int]:
        """Pages holding the longest run of seq's first full pages that is cached; seq (holding no pages)
        is left at least its last token to compute, whose logits give its next token."""
        if not self.enable_prefix_caching:
            return []
        num_pages = (seq.num_tokens - 1) // self.block_size
        self._hash_pages(seq, num_pages)
        hit = []
        for h in seq.block_hashes[:num_pages]:
            block_id = self.hash_to_block.get(h)
            if block_id is None:
                break
            hit.append(block_id)
        return hit

    def can_allocate(self, seq: Sequence, hit: list[int], num_tokens: int) -> bool:
        """Whether seq can take the cached pages `hit` and pages for its first num_tokens tokens."""
        unheld = sum(self.ref_counts[b] == 0 for b in hit)  # they leave the free pages when taken
        return blocks_for(num_tokens, self.block_size) - len(hit) + unheld <= self.num_free_blocks

    def allocate(self, seq: Sequence, hit: list[int], num_tokens: int) -> None:
        """Give seq (holding no pages) the cached pages `hit`, as computed tokens, then pages up to num_tokens."""
        if seq.block_table:
            raise RuntimeError("allocate: sequence already holds pages")
        for block_id in hit:
            if self.ref_counts[block_id] == 0:
                del self.cached_free[block_id]
            self.ref_counts[block_id] += 1
        seq.block_table = list(hit)
        seq.num_cached_tokens = len(hit) * self.block_size
        self.grow(seq, num_tokens)

    def cache_full_pages(self, seq: Sequence) -> None:
        """Register seq's full pages whose rows are computed (its first num_cached_tokens), so others reuse them.

        A page whose tokens are not all on the host yet (the newest, PENDING_TOKEN) waits for a later call.
        A sequence imported from a prefill worker (PD decode) offers none: its rows, and the ones computed
        over them, came from weights this engine cannot check."""
        if not self.enable_prefix_caching or seq.imported:
            return
        table = seq.block_table
        full = min(seq.num_cached_tokens // self.block_size, len(table))
        if full == 0 or self.block_hash[table[full - 1]] is not None:
            return  # no page newly full: most decode steps
        first = full - 1
        while first > 0 and self.block_hash[table[first - 1]] is None:  # pages register in order
            first -= 1
        self._hash_pages(seq, full)
        for i in range(first, min(full, len(seq.block_hashes))):
            h = seq.block_hashes[i]
            self.block_hash[table[i]] = h
            # a page computed twice at once (two equal prompts in one step) keeps the first copy's registration
            self.hash_to_block.setdefault(h, table[i])

    def _hash_pages(self, seq: Sequence, num_pages: int) -> None:
        """Extend seq.block_hashes to its first num_pages pages, stopping at a page with a token not on the host."""
        size, hashes = self.block_size, seq.block_hashes
        while len(hashes) < num_pages:
            i = len(hashes)
            tokens = seq.token_ids[i * size:(i + 1) * size]
            if len(tokens) < size or PENDING_TOKEN in tokens:
                return
            hashes.append(page_hash(hashes[-1] if hashes else b"", tokens))

    def free(self, seq: Sequence) -> None:
        """Give back all of seq's pages; its cached tokens are gone (a preempted sequence recomputes them, or
        finds them still cached). Pages no one else holds stay cached if registered, else become empty."""
        self.cache_full_pages(seq)
        # the last pages go first, so they are evicted first: a prefix's head is the likeliest to be shared
        for block_id in reversed(seq.block_table):
            self.ref_counts[block_id] -= 1
            if self.ref_counts[block_id] > 0:
                continue
            h = self.block_hash[block_id]
            if h is not None and self.hash_to_block.setdefault(h, block_id) == block_id:
                self.cached_free[block_id] = None
            else:
                self.block_hash[block_id] = None
                # empty pages go back first: they are the likeliest to be warm in a cache
                self.free_block_ids.appendleft(block_id)
        seq.block_table = []
        seq.num_cached_tokens = 0

    def adopt(self, seq: Sequence, num_cached_tokens: int) -> list[int]:
        """Give seq fresh pages for num_cached_tokens tokens that arrive from elsewhere (PD import).

        The caller copies the pages' contents into the returned ids, in order; seq then decodes from there.
        The pages never enter the prefix cache (seq.imported: see cache_full_pages)."""
        if seq.block_table:
            raise RuntimeError("adopt: sequence already holds pages")
        seq.imported = True
        self.grow(seq, num_cached_tokens)
        seq.num_cached_tokens = num_cached_tokens
        return list(seq.block_table)

    def slot(self, seq: Sequence, position: int) -> int:
        """Flat cache slot (page * block_size + offset) of token `position` of seq."""
        return seq.block_table[position // self.block_size] * self.block_size + position % self.block_size
