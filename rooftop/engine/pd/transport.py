"""KV pages between a prefill and a decode worker over TCP: length-prefixed frames of a JSON header and raw rows.

A frame is `MAGIC (4 bytes) | header length (u32) | payload length (u64)`, the header (UTF-8 JSON), then the
payload: for each layer, the prompt's latent rows `[n, kv_cache_dim]` and index-key rows `[n, index_head_dim]`
in the cache dtype, in token order (independent of either side's page size). The decode side answers each
frame with a frame carrying `{"ok": true}` or `{"ok": false, "error": "..."}` and no payload.
"""

import asyncio
import json
import socket
import struct
from dataclasses import dataclass

import torch

from rooftop.engine.kv.cache import KVCache

MAGIC = b"RKV1"
_PREFIX = struct.Struct("!4sIQ")
MAX_HEADER_BYTES = 64 << 20  # a long prompt's token ids and top logprobs, with room to spare
MAX_PAYLOAD_BYTES = 1 << 40
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}


class TransferError(Exception):
    """A KV transfer that did not complete; reason is one of unreachable, disconnected, timeout, bad_frame,
    refused (the decode worker answered no)."""

    def __init__(self, message: str, reason: str = "bad_frame"):
        super().__init__(message)
        self.reason = reason


@dataclass(slots=True)
class KVRows:
    """One sequence's cached rows, per layer, on the CPU: latent[l] is [n, kv_cache_dim], index_k[l] [n, d]."""

    latent: list[torch.Tensor]
    index_k: list[torch.Tensor]

    @property
    def num_tokens(self) -> int:
        return self.latent[0].shape[0] if self.latent else 0

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.latent + self.index_k)

    def describe(self) -> dict:
        """The header fields a receiver needs to cut the payload back into rows."""
        return {
            "num_layers": len(self.latent), "num_tokens": self.num_tokens,
            "dtype": DTYPE_NAMES[self.latent[0].dtype],
            "latent_dim": self.latent[0].shape[1], "index_dim": self.index_k[0].shape[1],
        }


def _slots(block_table: list[int], block_size: int, n: int, device: torch.device) -> torch.Tensor:
    """Flat cache slots of positions 0..n-1 of a sequence with this block table."""
    pos = torch.arange(n, device=device)
    pages = torch.tensor(block_table, dtype=torch.long, device=device)[pos // block_size]
    return pages * block_size + pos % block_size


def read_rows(cache: KVCache, block_table: list[int], n: int) -> KVRows:
    """Copy the first n tokens' rows out of the cache to the CPU (call on the engine thread)."""
    slots = _slots(block_table, cache.block_size, n, cache.device)
    latent = [t.view(-1, t.shape[-1])[slots].cpu() for t in cache.latent]
    index_k = [t.view(-1, t.shape[-1])[slots].cpu() for t in cache.index_k]
    return KVRows(latent, index_k)


def write_rows(cache: KVCache, block_table: list[int], rows: KVRows) -> None:
    """Write rows into the cache pages of block_table, token i into position i (call on the engine thread)."""
    slots = _slots(block_table, cache.block_size, rows.num_tokens, cache.device)
    for dst, src in zip(cache.latent + cache.index_k, rows.latent + rows.index_k, strict=True):
        dst.view(-1, dst.shape[-1])[slots] = src.to(device=cache.device, dtype=cache.dtype)


def check_rows_fit(header: dict, cache: KVCache) -> str | None:
    """Why rows described by header cannot go into this cache (another model or dtype), or None."""
    want = {"num_layers": len(cache.latent), "latent_dim": cache.latent[0].shape[-1],
            "index_dim": cache.index_k[0].shape[-1]}
    for key, value in want.items():
        if header.get(key) != value:
            return f"{key} {header.get(key)} from the prefill worker, {value} here (a different model?)"
    if header.get("dtype") != DTYPE_NAMES[cache.dtype]:
        return f"dtype {header.get('dtype')} from the prefill worker, {DTYPE_NAMES[cache.dtype]} here"
    return None


def payload_size(header: dict) -> int:
    """Bytes of payload a header describes."""
    elsize = torch.empty(0, dtype=DTYPES[header["dtype"]]).element_size()
    return header["num_layers"] * header["num_tokens"] * (header["latent_dim"] + header["index_dim"]) * elsize


def rows_from_payload(header: dict, payload: bytearray) -> KVRows:
    """Cut a received payload back into per-layer rows (no copy)."""
    dtype, n = DTYPES[header["dtype"]], header["num_tokens"]
    flat = torch.frombuffer(payload, dtype=dtype) if payload else torch.empty(0, dtype=dtype)
    latent, index_k, at = [], [], 0
    for _ in range(header["num_layers"]):
        for out, dim in ((latent, header["latent_dim"]), (index_k, header["index_dim"])):
            out.append(flat[at:at + n * dim].view(n, dim))
            at += n * dim
    return KVRows(latent, index_k)


def _frame_prefix(header_bytes: bytes, payload_len: int) -> bytes:
    return _PREFIX.pack(MAGIC, len(header_bytes), payload_len)


async def write_frame(writer: asyncio.StreamWriter, header: dict, rows: KVRows | None = None) -> int:
    """Send one frame; returns its size in bytes."""
    head = json.dumps(header, separators=(",", ":")).encode()
    payload_len = rows.nbytes if rows is not None else 0
    writer.write(_frame_prefix(head, payload_len) + head)
    if rows is not None:
        for latent, index_k in zip(rows.latent, rows.index_k, strict=True):
            for t in (latent, index_k):
                writer.write(t.contiguous().view(torch.uint8).numpy().tobytes())
                await writer.drain()  # bounded buffering for long prompts
    await writer.drain()
    return _PREFIX.size + len(head) + payload_len


async def read_frame(reader: asyncio.StreamReader) -> tuple[dict, bytearray, int]:
    """One frame: (header, payload, frame bytes). TransferError on a bad frame; IncompleteReadError on a closed
    peer."""
    magic, head_len, payload_len = _PREFIX.unpack(await reader.readexactly(_PREFIX.size))
    if magic != MAGIC:
        raise TransferError(f"bad frame: magic {magic!r}, expected {MAGIC!r} (not a rooftop KV peer?)")
    if head_len > MAX_HEADER_BYTES or payload_len > MAX_PAYLOAD_BYTES:
        raise TransferError(f"bad frame: header {head_len} bytes, payload {payload_len} bytes (too large)")
    try:
        header = json.loads(await reader.readexactly(head_len))
    except ValueError as exc:
        raise TransferError(f"bad frame: header is not JSON ({exc})") from None
    if not isinstance(header, dict):
        raise TransferError("bad frame: header is not a JSON object")
    payload = bytearray(await reader.readexactly(payload_len)) if payload_len else bytearray()
    return header, payload, _PREFIX.size + head_len + payload_len


async def send_kv(host: str, port: int, header: dict, rows: KVRows, timeout_s: float = 60.0) -> int:
    """Send one sequence's KV to a decode worker and wait for its answer; returns bytes sent.

    Raises TransferError naming the peer when it cannot be reached, drops the connection or refuses the rows."""
    peer = f"{host}:{port}"
    try:
        async with asyncio.timeout(timeout_s):
            reader, writer = await asyncio.open_connection(host, port)
            try:
                sent = await write_frame(writer, header, rows)
                reply, _, _ = await read_frame(reader)
            finally:
                writer.close()
                try:
                    await writer.wait_closed()
                except OSError:
                    pass
    except TimeoutError:
        raise TransferError(f"no answer from the decode worker's KV port {peer} within {timeout_s:.0f} s",
                            "timeout") from None
    except asyncio.IncompleteReadError:
        raise TransferError(f"the decode worker at {peer} closed the KV connection before answering",
                            "disconnected") from None
    except (ConnectionRefusedError, socket.gaierror) as exc:
        raise TransferError(f"cannot reach the decode worker's KV port {peer}: {type(exc).__name__}: {exc}",
                            "unreachable") from None
    except OSError as exc:
        raise TransferError(f"KV transfer to the decode worker at {peer} broke: {type(exc).__name__}: {exc}",
                            "disconnected") from None
    if not reply.get("ok"):
        raise TransferError(f"the decode worker at {peer} refused the KV: {reply.get('error', 'no reason given')}",
                            "refused")
    return sent
