"""OpenAI-compatible request bodies (validated strictly: a wrong type is a 400) and the error they raise."""

import json
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, model_validator


def _integral(value: Any) -> Any:
    """5.0 -> 5: a count written as a float that is whole (JSON writers do that); 2.5 stays and is refused."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


# ints that torch.Generator.manual_seed accepts
Seed = Annotated[int, BeforeValidator(_integral), Field(ge=-(2**63), lt=2**64)]
Count = Annotated[int, BeforeValidator(_integral), Field(ge=-(2**62), le=2**62)]  # range-checked later, clearly
TokenId = Annotated[int, Field(ge=0, lt=2**31)]

# Sampling fields vLLM honours and this engine does not, with the values that mean "off": any other value
# is refused with a 400 (ignoring it would sample differently from what the client asked). null is "off" too.
UNSUPPORTED_SAMPLING: dict[str, tuple] = {
    "n": (1,),
    "best_of": (1,),
    "use_beam_search": (False,),
    "min_p": (0,),
    "repetition_penalty": (1,),
    "presence_penalty": (0,),
    "frequency_penalty": (0,),
    "length_penalty": (1,),
    "logit_bias": ({},),
    "allowed_token_ids": ([],),
    "bad_words": ([],),
    "include_stop_str_in_output": (False,),
    "skip_special_tokens": (True,),
    "prompt_logprobs": (0,),
    "logprob_token_ids": ([],),
    "truncate_prompt_tokens": (),
    "response_format": ({"type": "text"},),
    "structured_outputs": (),
    "guided_json": (),
    "guided_regex": (),
    "guided_choice": (),
    "guided_grammar": (),
    "logits_processors": ([],),
    "watermarking": (False,),
    "repetition_detection": (),
    "thinking_token_budget": (-1,),
    "vllm_xargs": ({},),
}


class JsonBody(BaseModel):
    # unknown fields that do not change sampling (user, metadata, ...) are accepted and ignored
    model_config = ConfigDict(strict=True, extra="ignore", allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _null_is_default(cls, data: Any) -> Any:
        """An explicit null means the field's default, as OpenAI and vLLM read it (the openai client sends n=None)."""
        if isinstance(data, dict):
            return {key: value for key, value in data.items() if value is not None}
        return data


class StreamOptions(JsonBody):
    include_usage: bool = False


class _SamplingFields(JsonBody):
    unsupported: ClassVar[dict[str, tuple]] = UNSUPPORTED_SAMPLING

    model: str | None = None
    max_tokens: Count | None = None
    temperature: Annotated[float, Field(ge=0.0, le=100.0)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    top_k: Annotated[int, BeforeValidator(_integral), Field(ge=-1, le=2**31)] = 0  # 0 and -1: all tokens
    seed: Seed | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[TokenId] = []
    ignore_eos: bool = False
    min_tokens: Annotated[int, BeforeValidator(_integral), Field(ge=0, le=2**62)] = 0
    stream: bool = False
    stream_options: StreamOptions | None = None
    return_token_ids: bool = False  # vLLM's extension: the prompt's and completion's token ids

    @model_validator(mode="before")
    @classmethod
    def _refuse_what_is_not_implemented(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        for name, off in cls.unsupported.items():
            value = _integral(data.get(name))
            if value is not None and not any(type(value) is type(o) and value == o for o in off):
                default = f" or send {' or '.join(json.dumps(o) for o in off)}" if off else ""
                raise ApiError(400, f"unsupported parameter {name} ({json.dumps(data[name])[:80]}): this engine "
                               f"does not implement it; leave it out{default}", param=name,
                               code="unsupported_parameter")
        if data.get("stream_options") and data.get("stream") is not True:
            raise ApiError(400, "stream_options can only be given when stream is true", param="stream_options")
        return data


class CompletionRequest(_SamplingFields):
    prompt: str | list[TokenId] | list[str] | list[list[TokenId]]
    logprobs: Annotated[int, BeforeValidator(_integral), Field(ge=0, le=20)] | None = None
    echo: bool = False

    def one_prompt(self) -> str | list[int]:
        """The prompt, a one-element list of prompts unwrapped; ApiError(400) for a batch of them."""
        prompt = self.prompt
        if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
            if len(prompt) > 1:
                raise ApiError(400, f"a batch of prompts is not supported ({len(prompt)} given); send one request "
                               "per prompt", param="prompt", code="unsupported_parameter")
            prompt = prompt[0]
        return prompt

class TextPart(JsonBody):
    type: Literal["text"]
    text: str


class ChatMessage(JsonBody):
    role: str
    content: str | list[TextPart] | None = None


class ChatRequest(_SamplingFields):
    # vLLM's chat `echo` (prepend the last message) is not implemented either
    unsupported: ClassVar[dict[str, tuple]] = {**UNSUPPORTED_SAMPLING, "echo": (False,)}

    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: Count | None = None
    logprobs: bool = False
    top_logprobs: Annotated[int, BeforeValidator(_integral), Field(ge=0, le=20)] | None = None

    @model_validator(mode="after")
    def _top_logprobs_need_logprobs(self) -> "ChatRequest":
        if self.top_logprobs and not self.logprobs:
            raise ApiError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
        return self


class TokenizeRequest(JsonBody):
    prompt: str | None = None
    messages: list[dict] | None = None  # rendered with the chat template first
    add_special_tokens: bool = True  # the leading <bos>


class DetokenizeRequest(JsonBody):
    tokens: list[int]


class ProfileRequest(JsonBody):
    name: str | None = None  # trace file name, without .json.gz
    eager: bool = False  # run steps eagerly while profiling (each kernel under its module), not by graph replay


class ApiError(Exception):
    """A request the server refuses: HTTP status plus an OpenAI-style error body."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 type_: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type_ or {400: "invalid_request_error", 404: "not_found_error", 405: "invalid_request_error",
                              503: "service_unavailable"}.get(status, "server_error")

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def route_error(method: str, path: str, status: int) -> ApiError:
    """The OpenAI-style error of a request no route takes: 404 (no such path) or 405 (not with this method)."""
    if status == 405:
        return ApiError(405, f"{path} does not take {method} requests", code="method_not_allowed")
    if status == 404:
        return ApiError(404, f"no route {method} {path} on this server (the API is under /v1/)", code="not_found")
    return ApiError(status, f"{method} {path}: HTTP {status}")


def parse_body(model: type[BaseModel], raw: bytes) -> BaseModel:
    """Validate a JSON body; any problem is an ApiError(400) that names the field."""
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        err = exc.errors(include_url=False)[0]
        if err["type"] == "json_invalid":
            raise ApiError(400, f"request body is not valid JSON: {err['msg']}", code="invalid_json") from None
        loc = ".".join(str(p) for p in err["loc"])
        more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        msg = f"{loc}: {err['msg']}{more}" if loc else f"{err['msg']}{more}"
        raise ApiError(400, msg, param=loc or None, code="invalid_value") from None
    except (ValueError, UnicodeError) as exc:  # not JSON, or not UTF-8
        raise ApiError(400, f"request body is not valid JSON: {exc}", code="invalid_json") from None


def stop_list(stop: str | list[str] | None) -> list[str]:
    """The stop strings of a request, empty ones dropped (they would match everywhere)."""
    if stop is None:
        return []
    stops = [stop] if isinstance(stop, str) else stop
    return [s for s in stops if s]
