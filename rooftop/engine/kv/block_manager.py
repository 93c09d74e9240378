"""Which KV-cache pages are free and which sequence holds which: the paged cache's bookkeeping."""

from collections import deque

from rooftop.engine.sequence import Sequence


def blocks_for(num_tokens: int, block_size: int) -> int:
    """Pages needed to hold num_tokens tokens."""
    return (num_tokens + block_size - 1) // block_size


class BlockManager:
    """Hands out physical page ids of the KV cache; a sequence's pages are its block_table, in order."""

    def __init__(self, num_blocks: int, block_size: int):
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError(f"num_blocks ({num_blocks}) and block_size ({block_size}) must be positive")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.free_block_ids: deque[int] = deque(range(num_blocks))

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_block_ids)

    @property
    def usage(self) -> float:
        """Fraction of pages held by sequences (0..1)."""
        return 1.0 - len(self.free_block_ids) / self.num_blocks

    def num_missing_blocks(self, seq: Sequence, num_tokens: int) -> int:
        """Pages seq must still get so that its first num_tokens tokens have a slot."""
        return max(0, blocks_for(num_tokens, self.block_size) - len(seq.block_table))

    def can_grow(self, seq: Sequence, num_tokens: int) -> bool:
        return self.num_missing_blocks(seq, num_tokens) <= len(self.free_block_ids)

    def grow(self, seq: Sequence, num_tokens: int) -> None:
        """Give seq pages until its first num_tokens tokens have a slot (call can_grow first)."""
        missing = self.num_missing_blocks(seq, num_tokens)
        if missing > len(self.free_block_ids):
            raise RuntimeError(f"KV cache: {missing} pages needed, {len(self.free_block_ids)} free")
        for _ in range(missing):
            seq.block_table.append(self.free_block_ids.popleft())

    def free(self, seq: Sequence) -> None:
        """Return all of seq's pages; its cached tokens are gone (a preempted sequence recomputes them)."""
        # most recently used pages go back first: they are the likeliest to be warm in a cache
        self.free_block_ids.extendleft(reversed(seq.block_table))
        seq.block_table = []
        seq.num_cached_tokens = 0

    def adopt(self, seq: Sequence, num_cached_tokens: int) -> list[int]:
        """Give seq fresh pages for num_cached_tokens tokens that arrive from elsewhere (PD import).

        The caller copies the pages' contents into the returned ids, in order; seq then decodes from there.
        """
        if seq.block_table:
            raise RuntimeError("adopt: sequence already holds pages")
        self.grow(seq, num_cached_tokens)
        seq.num_cached_tokens = num_cached_tokens
        return list(seq.block_table)

    def slot(self, seq: Sequence, position: int) -> int:
        """Flat cache slot (page * block_size + offset) of token `position` of seq."""
        return seq.block_table[position // self.block_size] * self.block_size + position % self.block_size
