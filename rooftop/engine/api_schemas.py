"""OpenAI-compatible request bodies (validated strictly: a wrong type is a 400) and the error they raise."""

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

# ints that torch.Generator.manual_seed accepts
Seed = Annotated[int, Field(ge=-(2**63), lt=2**64)]
Count = Annotated[int, Field(ge=-(2**62), le=2**62)]  # range-checked later with a clear message


class JsonBody(BaseModel):
    # unknown OpenAI fields (user, presence_penalty, ...) are accepted and ignored
    model_config = ConfigDict(strict=True, extra="ignore", allow_inf_nan=False)


class StreamOptions(JsonBody):
    include_usage: bool = False


class _SamplingFields(JsonBody):
    model: str | None = None
    max_tokens: Count | None = None
    temperature: Annotated[float, Field(ge=0.0, le=100.0)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    seed: Seed | None = None
    stop: str | list[str] | None = None
    ignore_eos: bool = False
    min_tokens: Annotated[int, Field(ge=0, le=2**62)] = 0
    n: Literal[1] = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    return_token_ids: bool = False  # vLLM's extension: the prompt's and completion's token ids


class CompletionRequest(_SamplingFields):
    prompt: str | list[Annotated[int, Field(ge=0, lt=2**31)]]
    logprobs: Annotated[int, Field(ge=0, le=20)] | None = None


class TextPart(JsonBody):
    type: Literal["text"]
    text: str


class ChatMessage(JsonBody):
    role: str
    content: str | list[TextPart] | None = None


class ChatRequest(_SamplingFields):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: Count | None = None
    logprobs: bool = False
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None


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
        self.type = type_ or {400: "invalid_request_error", 404: "not_found_error",
                              503: "service_unavailable"}.get(status, "server_error")

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def parse_body(model: type[BaseModel], raw: bytes) -> BaseModel:
    """Validate a JSON body; any problem is an ApiError(400) that names the field."""
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        err = exc.errors(include_url=False)[0]
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
