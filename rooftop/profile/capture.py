"""Capture a trace through an engine's POST /start_profile and /stop_profile while a bounded load runs.

The load is `concurrency` streaming completions that run past the profile window; the profile starts
once every stream decodes and stops after about `steps` decode steps (tokens per stream). The
embedded engine answers /stop_profile with {"trace": PATH}; SGLang and vLLM write into their profiler
directory (SGLANG_TORCH_PROFILER_DIR; vLLM's --profiler-config, or VLLM_TORCH_PROFILER_DIR before
0.13.0), passed here as `trace_dir`. Of what they write there, the workers' traces are kept, rank 0
first (`rank0.*`, `dp0_pp0_tp0_..._rank0.*`, `TP-0`); the API server's (`*async_llm*`), which holds
no model work, is not.

A target on another host (`Target.files`: anything with `list_files(dir, since_s)` and
`fetch(path, local_path)`, such as `rooftop.launch.ssh.HostFiles`) has its trace directory listed
there before and after the window (what is new is what the first listing lacked: the two machines'
clocks are never compared) and its traces fetched into out_dir; every rank's trace is kept once, rank
0 first. A server over several hosts keeps each host's traces in a directory named after the host
(`files.name`), which `profile.ranks` shows beside each rank.
"""

import asyncio
import json
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from rooftop.auth import auth_headers, refused_hint
from rooftop.errors import RooftopError
from rooftop.profile.ranks import trace_rank

ENGINES = ("embedded", "sglang", "vllm")
_TRACE_SUFFIXES = (".json", ".json.gz", ".pt.trace.json", ".pt.trace.json.gz")


@dataclass(slots=True)
class Target:
    """A server to profile: its role, its base URL (/start_profile, /stop_profile) and, for SGLang and
    vLLM, the directory its profiler writes into."""

    name: str
    url: str
    trace_dir: str | Path | None = None
    files: object | None = None  # on another host: list_files(dir, since_s) -> {path: size}, fetch(path, dst)
    # the same server's other nodes (a multi-node role): (their files or None for this host, their trace dir);
    # /start_profile on rank 0 profiles every rank, and each node writes its ranks' traces where it runs
    more: list[tuple[object | None, str]] = field(default_factory=list)


async def capture(base_url: str, out_dir: str | Path, *, engine: str, steps: int, concurrency: int = 1,
                  prompt_words: int = 32, model: str | None = None, trace_dir: str | Path | None = None,
                  timeout_s: float = 600.0, start_body: dict | None = None, arrivals: bool = False,
                  api_key: str | None = None) -> Path:
    """Profile about `steps` decode steps at `concurrency` of the server at `base_url`; copy its trace(s)
    into out_dir and return the first (rank 0). `arrivals`: short requests arrive during the window, so
    it holds prefills too (an eager map that must cover a pd prefill worker's steps)."""
    traces = await capture_targets(base_url, out_dir, [Target("single", base_url, trace_dir)], engine=engine,
                                   steps=steps, concurrency=concurrency, prompt_words=prompt_words, model=model,
                                   timeout_s=timeout_s, start_body=start_body, arrivals=arrivals, api_key=api_key)
    return traces["single"][0]


async def capture_targets(load_url: str, out_dir: str | Path, targets: list[Target], *, engine: str, steps: int,
                          concurrency: int = 1, prompt_words: int = 32, model: str | None = None,
                          timeout_s: float = 600.0, start_body: dict | None = None,
                          arrivals: bool = False, api_key: str | None = None) -> dict[str, list[Path]]:
    """Load `load_url` (a pd router, or the server itself) and profile every target at once over about
    `steps` decode steps: {target name: its traces copied into out_dir (out_dir/NAME/ when there are
    several targets), rank 0 first}. `start_body` goes with /start_profile (the embedded engine's
    {"eager": true}). Short requests arrive during the window where a target is a prefill worker, or
    with `arrivals`. `api_key` goes with every request, as auth.py sends it."""
    if engine not in ENGINES:
        raise RooftopError(f"unknown engine {engine!r} for profile capture", f"use one of: {', '.join(ENGINES)}")
    if engine != "embedded" and any(t.trace_dir is None for t in targets):
        raise RooftopError(
            f"{engine} writes traces to its profiler directory, which capture was not told",
            "pass trace_dir= the directory the server's profiler was started with (vLLM --profiler-config, "
            "SGLANG_TORCH_PROFILER_DIR)",
        )
    if steps < 1 or concurrency < 1:
        raise RooftopError(f"steps={steps}, concurrency={concurrency}: both must be at least 1", "")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    load_url = load_url.rstrip("/")
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    started_s = time.time()
    replies: dict[str, object] = {}  # target name -> its /stop_profile answer
    # What each other host's trace directory holds before the window: a trace is a file not listed then
    # (or grown since), so the two machines' clocks never meet.
    before: dict[tuple[int, str], dict[str, int]] = {}
    if engine != "embedded":
        for t in targets:
            for files, directory in [(t.files, str(t.trace_dir)), *t.more]:
                if files is not None:
                    before[(id(files), directory)] = await asyncio.to_thread(files.list_files, directory, 0.0)
    try:
        async with aiohttp.ClientSession(timeout=timeout, headers=auth_headers(api_key)) as session:
            model = model or await _model_name(session, load_url)
            load = _Load(session, load_url, model, concurrency, prompt_words, max_tokens=steps * 3 + 32)
            # A prefill worker only works when a request arrives: while it is profiled, one more stream
            # sends short requests, so the window holds prefills (and decode sees arrivals, as served).
            arrive = arrivals or any(t.name == "prefill" for t in targets)
            arrivals = _Load(session, load_url, model, 1, prompt_words, max_tokens=2)
            tasks = [asyncio.create_task(load.stream(i)) for i in range(concurrency)]
            try:
                await load.wait(lambda: all(n >= 2 for n in load.tokens), tasks)
                # every target starts and stops at once: the window is the same on each, and a worker that
                # stops slowly (vLLM writes its trace first) does not keep the others profiling
                await asyncio.gather(*(_post(session, f"{t.url.rstrip('/')}/start_profile",
                                             {**({"name": f"rooftop-{int(started_s)}-{t.name}"}
                                                 if engine == "embedded" else {}), **(start_body or {})})
                                       for t in targets))
                if arrive:
                    tasks.append(asyncio.create_task(arrivals.stream(0)))
                at_start = sum(load.tokens)
                await load.wait(lambda: (sum(load.tokens) - at_start) >= steps * concurrency
                                and (len(tasks) == concurrency or arrivals.tokens[0] >= 2), tasks)
                stopped = await asyncio.gather(*(_post(session, f"{t.url.rstrip('/')}/stop_profile", {})
                                                 for t in targets))
                replies = {t.name: reply for t, reply in zip(targets, stopped, strict=True)}
            finally:
                load.stop = arrivals.stop = True
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
    except aiohttp.ClientConnectionError as exc:
        raise RooftopError(f"cannot reach the engine at {load_url} ({exc})", "check that it is up: GET /health") from None
    except TimeoutError:
        raise RooftopError(f"profile capture at {load_url} took longer than {timeout_s:.0f} s",
                           "lower steps or raise timeout_s") from None

    out: dict[str, list[Path]] = {}
    for t in targets:
        dst_dir = out_dir if len(targets) == 1 else out_dir / t.name
        dst_dir.mkdir(parents=True, exist_ok=True)
        if engine == "embedded":
            reply = replies[t.name]
            src = Path(reply.get("trace", "")) if isinstance(reply, dict) else None
            if t.files is not None and src and str(src) not in (".", ""):
                out[t.name] = [await asyncio.to_thread(t.files.fetch, str(src), dst_dir / src.name)]
                continue
            if not src or not src.is_file():
                raise RooftopError(f"{t.name}'s /stop_profile named no readable trace ({reply!r})",
                                   "run capture on the machine where the engine writes its traces")
            sources = [src]
        else:
            out[t.name] = []
            sources = [(t.files, str(t.trace_dir)), *t.more]
            seen: set[str] = set()  # remote paths already fetched: nodes sharing a file system list the same files
            for files, directory in sources:
                # a server over several hosts keeps each host's traces apart, in a directory named after it
                host = getattr(files, "name", None) or "local"
                into = dst_dir / host if len(sources) > 1 else dst_dir
                out[t.name] += await _copy_new_traces(files, directory, into, started_s, timeout_s,
                                                      before=before.get((id(files), directory)), seen=seen)
            out[t.name] = worker_traces(out[t.name])
            continue
        out[t.name] = []
        for src in sources:
            shutil.copyfile(src, dst_dir / src.name)
            out[t.name].append(dst_dir / src.name)
    return out


async def _copy_new_traces(files, directory: str, dst_dir: Path, since_s: float, timeout_s: float,
                           before: dict[str, int] | None = None, seen: set[str] | None = None) -> list[Path]:
    """The workers' traces written in `directory` (on this host, or on another through `files`) after
    since_s, copied into dst_dir. On another host, a trace is a file that `before` (the directory's listing
    before the window) does not hold, or holds smaller; without `before`, one modified after since_s by
    that host's clock, less 5 s. Remote paths in `seen` are skipped (and those fetched added to it)."""
    dst_dir.mkdir(parents=True, exist_ok=True)
    if files is None:
        sources = await _new_traces(Path(directory), since_s, timeout_s)
        for src in sources:
            shutil.copyfile(src, dst_dir / src.name)
        return [dst_dir / src.name for src in sources]
    seen = set() if seen is None else seen
    remote = await _new_remote_traces(files, directory, since_s, timeout_s, before)
    out = []
    for src in remote:
        if src not in seen:
            seen.add(src)
            out.append(await asyncio.to_thread(files.fetch, src, dst_dir / Path(src).name))
    return out


class _Load:
    """Streaming completions, `concurrency` at a time, counting tokens per stream slot."""

    def __init__(self, session, base_url, model, concurrency, prompt_words, max_tokens):
        self.session, self.url, self.model = session, f"{base_url}/v1/completions", model
        self.prompt = " ".join(["profile"] * prompt_words)
        self.max_tokens = max_tokens
        self.tokens = [0] * concurrency
        self.stop = False
        self.error: str | None = None

    async def stream(self, slot: int) -> None:
        body = {"model": self.model, "prompt": self.prompt, "max_tokens": self.max_tokens, "stream": True,
                "temperature": 0.0, "ignore_eos": True}
        while not self.stop:
            async with self.session.post(self.url, json=body) as resp:
                if resp.status != 200:
                    self.error = f"POST /v1/completions -> {resp.status}: {(await resp.text())[:300]}"
                    return
                async for line in resp.content:
                    if line.startswith(b"data: ") and not line.startswith(b"data: [DONE]"):
                        self.tokens[slot] += 1

    async def wait(self, done, tasks) -> None:
        while not done():
            if self.error:
                raise RooftopError(f"the profile load failed: {self.error}", "check the model name and the server log")
            if all(t.done() for t in tasks):
                raise RooftopError("the profile load stopped before the window was covered", "check the server log")
            await asyncio.sleep(0.01)


async def _model_name(session: aiohttp.ClientSession, base_url: str) -> str:
    async with session.get(f"{base_url}/v1/models") as resp:
        if resp.status != 200:
            raise RooftopError(f"GET {base_url}/v1/models -> {resp.status}",
                               refused_hint(resp.status, "the deployment's api-key arg") or "pass model= explicitly")
        data = (await resp.json()).get("data") or []
    if not data:
        raise RooftopError(f"{base_url}/v1/models lists no model", "pass model= explicitly")
    return data[0]["id"]


async def _post(session: aiohttp.ClientSession, url: str, body: dict):
    async with session.post(url, json=body) as resp:
        text = await resp.text()
        if resp.status != 200:
            raise RooftopError(f"POST {url} -> {resp.status}: {text[:300]}",
                               "start the engine with profiling enabled (embedded: --profile-dir DIR; vLLM: "
                               "--profiler-config; SGLang: SGLANG_TORCH_PROFILER_DIR)")
    try:
        return json.loads(text) if text.strip() else {}
    except ValueError:
        return {"text": text}


_FRONT_END = re.compile(r"async_llm|api_server|frontend", re.I)


def worker_traces(paths: list[Path]) -> list[Path]:
    """The engine workers' traces among `paths` (the API server's left out, each path once), rank 0 first."""
    def rank(p: Path) -> int:
        found = trace_rank(p)
        return found if found is not None else 1 << 30

    unique = dict.fromkeys(paths)
    return sorted((p for p in unique if not _FRONT_END.search(p.name)), key=lambda p: (rank(p), str(p)))


async def _new_remote_traces(files, trace_dir: str, since_s: float, timeout_s: float,
                             before: dict[str, int] | None = None) -> list[str]:
    """Paths of trace files written in trace_dir on another host (not in `before`, or grown since; without
    it, modified after since_s - 5 s by that host's clock), once their sizes settle."""
    deadline = time.monotonic() + timeout_s
    sizes: dict[str, int] = {}
    while time.monotonic() < deadline:
        if before is None:
            listed = await asyncio.to_thread(files.list_files, trace_dir, since_s - 5)  # clocks of two hosts differ
        else:
            listed = await asyncio.to_thread(files.list_files, trace_dir, 0.0)
            listed = {p: n for p, n in listed.items() if before.get(p, -1) != n}
        now = {p: n for p, n in listed.items() if p.endswith(_TRACE_SUFFIXES)}
        workers = worker_traces([Path(p) for p in now])
        if workers and now == sizes:
            return [str(p) for p in workers]
        sizes = now
        await asyncio.sleep(1.0)
    raise RooftopError(f"no new trace appeared in {trace_dir} on its host within {timeout_s:.0f} s",
                       "check that the server's profiler directory is this one")


async def _new_traces(trace_dir: Path, since_s: float, timeout_s: float) -> list[Path]:
    """Trace files written in trace_dir after since_s, once their sizes stop changing."""
    deadline = time.monotonic() + timeout_s
    sizes: dict[Path, int] = {}
    while time.monotonic() < deadline:
        found = sorted(
            p for p in trace_dir.rglob("*")
            if p.is_file() and p.name.endswith(_TRACE_SUFFIXES) and p.stat().st_mtime >= since_s
        )
        now = {p: p.stat().st_size for p in found}
        workers = worker_traces(found)
        if workers and now == sizes:
            return workers
        sizes = now
        await asyncio.sleep(1.0)
    raise RooftopError(f"no new trace appeared in {trace_dir} within {timeout_s:.0f} s",
                       "check that the server's profiler directory is this one")
