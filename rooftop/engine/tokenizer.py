"""Byte-level tokenizer: ids 0..255 are UTF-8 bytes, then <bos> 256, <eos> 257, <pad> 258."""

import codecs
from collections.abc import Callable

from rooftop.engine.model.config import BOS_ID, EOS_ID, PAD_ID

SPECIALS = {"<bos>": BOS_ID, "<eos>": EOS_ID, "<pad>": PAD_ID}


class ByteTokenizer:
    """Text <-> token ids; specials are never produced from text and are dropped when decoding."""

    bos_id, eos_id, pad_id = BOS_ID, EOS_ID, PAD_ID
    num_ids = 259  # bytes + specials; the model's vocab_size is this rounded up

    def encode(self, text: str, add_bos: bool = True) -> list[int]:
        """UTF-8 bytes of `text`, after <bos> when `add_bos`."""
        ids = list(text.encode("utf-8"))
        return [BOS_ID, *ids] if add_bos else ids

    def decode(self, ids: list[int]) -> str:
        """Text of the byte ids; specials and ids past the byte range are skipped, bad UTF-8 replaced."""
        return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")

    def stream_decoder(self) -> Callable[[int], str]:
        """A function fed one id at a time that returns the text completed so far (may be "")."""
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        return lambda i: decoder.decode(bytes([i])) if 0 <= i < 256 else ""

    def render_chat(self, messages: list[dict]) -> str:
        """A plain chat prompt: one "role: content" line per message, then "assistant: "."""
        lines = [f"{m.get('role', 'user')}: {m.get('content') or ''}" for m in messages]
        return "\n".join(lines) + "\nassistant: "
