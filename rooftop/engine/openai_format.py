"""Engine tokens -> OpenAI-shaped JSON: completions, chat completions, their stream chunks, logprobs, usage."""

import codecs
import math
import time
import uuid
from dataclasses import dataclass

from rooftop.engine.engine import TokenEvent
from rooftop.engine.model.config import BOS_ID, EOS_ID, PAD_ID

_SPECIAL_NAMES = {BOS_ID: "<bos>", EOS_ID: "<eos>", PAD_ID: "<pad>"}


def token_str(token_id: int) -> str:
    """Printable, unique name of a token: its byte as text (\\xNN when not ASCII), or <special>."""
    if 0 <= token_id < 128:
        return chr(token_id)
    if token_id < 256:
        return f"\\x{token_id:02x}"
    return _SPECIAL_NAMES.get(token_id, f"<unused_{token_id}>")


def _lp(logprob: float) -> float:
    """A logprob JSON can carry: -inf (a barred token) becomes -9999.0, as vLLM writes it."""
    return logprob if math.isfinite(logprob) else -9999.0


def token_bytes(token_id: int) -> list[int]:
    return [token_id] if 0 <= token_id < 256 else []


@dataclass(slots=True)
class Reply:
    """What the formatters need to know about one request."""

    model: str
    chat: bool
    num_prompt_tokens: int
    prompt_token_ids: list[int] | None  # set when the request asked for token ids
    num_logprobs: int | None  # top-N logprobs per position; None = no logprobs
    echo: str = ""  # completions with echo: the prompt's text, put before the completion's
    request_id: str = ""
    created: int = 0

    def __post_init__(self):
        self.request_id = ("chatcmpl-" if self.chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())


def usage(num_prompt_tokens: int, num_completion_tokens: int) -> dict:
    return {"prompt_tokens": num_prompt_tokens, "completion_tokens": num_completion_tokens,
            "total_tokens": num_prompt_tokens + num_completion_tokens}


class TextOffsets:
    """Where each generated token's text begins in the completion's text, in characters, token by token.

    Taken from the tokens, not from the text events carry: an event's text is what the engine releases,
    held back while it could still be part of a stop string. A byte inside a UTF-8 character is at the
    offset where that character will stand; the tokens of a stop string that was cut off point past the
    text's end."""

    def __init__(self):
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")  # as the engine decodes
        self._chars = 0

    def next(self, token_id: int) -> int:
        """The offset of this token, the one after the last one passed."""
        offset = self._chars
        if 0 <= token_id < 256:
            self._chars += len(self._decoder.decode(bytes([token_id])))
        return offset


def _completion_logprobs(events: list[TokenEvent], offsets: list[int]) -> dict:
    return {
        "tokens": [token_str(ev.token_id) for ev in events],
        "token_logprobs": [_lp(ev.logprob) for ev in events],
        "top_logprobs": [{token_str(i): _lp(lp) for i, lp in ev.top} for ev in events],
        "text_offset": offsets,
    }


def _chat_logprobs(events: list[TokenEvent]) -> dict:
    return {"content": [
        {"token": token_str(ev.token_id), "logprob": _lp(ev.logprob), "bytes": token_bytes(ev.token_id),
         "top_logprobs": [{"token": token_str(i), "logprob": _lp(lp), "bytes": token_bytes(i)}
                          for i, lp in ev.top]}
        for ev in events
    ]}


def full_response(reply: Reply, events: list[TokenEvent]) -> dict:
    """The non-streamed body of a finished request."""
    text = reply.echo + "".join(ev.text for ev in events)
    finish = events[-1].finish_reason if events else "length"
    if reply.chat:
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish,
                  "logprobs": _chat_logprobs(events) if reply.num_logprobs is not None else None}
    else:
        choice = {"index": 0, "text": text, "finish_reason": finish,
                  "logprobs": None}
        if reply.num_logprobs is not None:
            offsets = TextOffsets()
            choice["logprobs"] = _completion_logprobs(events, [offsets.next(ev.token_id) for ev in events])
    if reply.prompt_token_ids is not None:
        choice["prompt_token_ids"] = reply.prompt_token_ids
        choice["token_ids"] = [ev.token_id for ev in events]
    return {
        "id": reply.request_id,
        "object": "chat.completion" if reply.chat else "text_completion",
        "created": reply.created,
        "model": reply.model,
        "choices": [choice],
        "usage": usage(reply.num_prompt_tokens, len(events)),
    }


def stream_chunk(reply: Reply, ev: TokenEvent, first: bool, text_offset: int) -> dict:
    """The chunk of one generated token (the last one carries finish_reason); text_offset: where the token's text
    begins in the completion's (TextOffsets)."""
    if reply.chat:
        delta = {"role": "assistant", "content": ev.text} if first else {"content": ev.text}
        choice = {"index": 0, "delta": delta, "finish_reason": ev.finish_reason,
                  "logprobs": _chat_logprobs([ev]) if reply.num_logprobs is not None else None}
    else:
        text = reply.echo + ev.text if first else ev.text
        choice = {"index": 0, "text": text, "finish_reason": ev.finish_reason,
                  "logprobs": _completion_logprobs([ev], [text_offset]) if reply.num_logprobs is not None else None}
    if reply.prompt_token_ids is not None:
        if first:
            choice["prompt_token_ids"] = reply.prompt_token_ids
        choice["token_ids"] = [ev.token_id]
    return {"id": reply.request_id, "object": "chat.completion.chunk" if reply.chat else "text_completion",
            "created": reply.created, "model": reply.model, "choices": [choice]}


def usage_chunk(reply: Reply, num_completion_tokens: int) -> dict:
    """The chunk after the last token when stream_options.include_usage: usage and no choices."""
    return {"id": reply.request_id, "object": "chat.completion.chunk" if reply.chat else "text_completion",
            "created": reply.created, "model": reply.model, "choices": [],
            "usage": usage(reply.num_prompt_tokens, num_completion_tokens)}
