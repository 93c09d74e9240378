"""Adapters: how rooftop drives each engine it deploys (the embedded engine of `rooftop/engine/`, SGLang,
vLLM). Each is a module with the same few names (the `Engine` protocol):

    NAME, DEFAULT_PORTS, PROFILE_DIR_ENV
    installed(python, topology) -> bool    is the engine (and its pd router) importable by that interpreter
    install_hint() -> str                  how to get it
    process_specs(spec, run_dir) -> list[ProcessSpec]   argv/env/GPUs per role, router last
    endpoints(url, role) -> Endpoints      health, metrics and profiling URLs of one server
    eager_variant(spec) -> spec | None     the deployment run without graphs/compilation (the profile's
                                           map of module paths), None where it already runs eagerly or
                                           EAGER_PROFILE gives the map
    EAGER_PROFILE: dict | None             the /start_profile body that profiles the same server eagerly
                                           (then no eager_variant is brought up for the map)

`protocol.py` states the protocol; `processes.py` (`build_processes`) is the one entry point the rest of
rooftop needs: ports resolved, CPUs placed.
"""
