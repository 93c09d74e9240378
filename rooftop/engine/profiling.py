"""A torch profiler around the engine's steps, started and stopped on its step thread between two steps."""

from concurrent.futures import Future
from pathlib import Path

import torch


def activities(device: torch.device) -> list:
    acts = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    return acts


def warm_profiler(device: torch.device) -> None:
    """Start and stop a profiler once on the process's main thread: Kineto wants its first client
    registered there, or a later profile started on the engine thread logs an error and may miss
    device activity."""
    with torch.profiler.profile(activities=activities(device)):
        torch.ones(1, device=device).add_(1)


class StepProfiler:
    """One profile at a time of an engine (an object with `call(fn) -> Future` and `runner`)."""

    def __init__(self, engine):
        self.engine = engine
        self._prof: torch.profiler.profile | None = None
        self._path: Path | None = None

    def start(self, path: Path, eager: bool) -> Future:
        """Profile from the next step on; the future's result says whether the steps run as CUDA graphs.
        eager: run the steps eagerly while profiling, each kernel under its module."""
        if self._prof is not None:
            raise RuntimeError("a profile is already running; POST /stop_profile first")
        runner = self.engine.runner
        prof = torch.profiler.profile(activities=activities(runner.device), record_shapes=True, with_stack=True,
                                      with_modules=True)
        self._prof, self._path = prof, path

        def start() -> bool:
            runner.profile_eager = eager
            prof.start()
            return runner.graphs is not None and not eager

        return self.engine.call(start)

    def stop(self) -> Future:
        """Stop and write the trace; the future's result is its path."""
        if self._prof is None:
            raise RuntimeError("no profile is running; POST /start_profile first")
        prof, path = self._prof, self._path
        self._prof = self._path = None
        runner = self.engine.runner

        def stop_and_export() -> str:
            prof.stop()
            runner.profile_eager = False
            path.parent.mkdir(parents=True, exist_ok=True)
            prof.export_chrome_trace(str(path))
            return str(path)

        return self.engine.call(stop_and_export)
