"""Client-side token counting: a local Hugging Face tokenizer, or the server's /tokenize."""

from __future__ import annotations

from pathlib import Path

import aiohttp

from rooftop.errors import RooftopError


class HFTokenizer:
    """A tokenizer.json from a local Hugging Face model directory (needs the `tokenizers` package)."""

    name = "hf"

    def __init__(self, path: str | Path):
        try:
            from tokenizers import Tokenizer  # optional dependency
        except ImportError as exc:
            raise RooftopError(
                "--tokenizer needs the `tokenizers` package", "pip install tokenizers, or drop --tokenizer "
                "to count with the server's /tokenize"
            ) from exc
        p = Path(path)
        f = p / "tokenizer.json" if p.is_dir() else p
        if not f.is_file():
            raise RooftopError(f"no tokenizer.json at {p}", "point --tokenizer at a local HF model directory")
        self._tok = Tokenizer.from_file(str(f))

    async def encode(self, text: str, special: bool = True) -> list[int]:
        return self._tok.encode(text, add_special_tokens=special).ids

    async def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=True)

    async def count(self, text: str, special: bool = True) -> int:
        return len(await self.encode(text, special))


class ServerTokenizer:
    """The server's POST /tokenize and /detokenize (vLLM's shapes; SGLang and the embedded engine match)."""

    name = "server"

    def __init__(self, session: aiohttp.ClientSession, base_url: str, model: str):
        self._session = session
        self._base = base_url.rstrip("/")
        self._model = model
        self.can_decode = True
        self.max_model_len: int | None = None  # the served context, where /tokenize tells it (vLLM does)

    async def encode(self, text: str, special: bool = True) -> list[int]:
        body = {"model": self._model, "prompt": text, "add_special_tokens": special}
        try:
            async with self._session.post(f"{self._base}/tokenize", json=body) as resp:
                if resp.status != 200:
                    raise RooftopError(
                        f"{self._base}/tokenize answered HTTP {resp.status}",
                        "pass --tokenizer DIR (a local HF tokenizer) so prompts can be sized and checked",
                    )
                data = await resp.json()
        except (aiohttp.ClientError, OSError) as exc:
            raise RooftopError(
                f"the server at {self._base} stopped answering /tokenize ({type(exc).__name__})",
                "check that the server is still up",
            ) from exc
        tokens = data.get("tokens") if isinstance(data, dict) else None
        if isinstance(data, dict) and isinstance(data.get("max_model_len"), int):
            self.max_model_len = data["max_model_len"]
        if not isinstance(tokens, list) or (text and not tokens):
            # e.g. llama.cpp's /tokenize, which reads "content", answers an empty list to vLLM's body
            raise RooftopError(
                f"{self._base}/tokenize answered {'no tokens' if isinstance(tokens, list) else 'without a token list'} "
                f"for {len(text)} characters of text: the client cannot size prompts with it",
                "pass --tokenizer DIR (a local Hugging Face tokenizer of the served model)",
            )
        return tokens

    async def decode(self, ids: list[int]) -> str:
        body = {"model": self._model, "tokens": ids}
        try:
            async with self._session.post(f"{self._base}/detokenize", json=body) as resp:
                if resp.status != 200:
                    self.can_decode = False
                    raise LookupError("no /detokenize")
                data = await resp.json()
        except (aiohttp.ClientError, OSError) as exc:
            raise RooftopError(
                f"the server at {self._base} stopped answering /detokenize ({type(exc).__name__})",
                "check that the server is still up",
            ) from exc
        return data["prompt"]

    async def count(self, text: str, special: bool = True) -> int:
        return len(await self.encode(text, special))
