"""Secrets never reach a document: environment names containing KEY, TOKEN, SECRET or PASSWORD are redacted."""

SECRET_MARKERS = ("KEY", "TOKEN", "SECRET", "PASSWORD")
REDACTED = "<redacted>"


def is_secret(name: str) -> bool:
    """True when an environment variable or flag name looks like it holds a secret."""
    upper = name.upper().replace("-", "_")
    return any(marker in upper for marker in SECRET_MARKERS)


def is_secret_flag(flag: str) -> bool:
    """True for a flag whose value is a secret (`--api-key`, `--hf-token`); `--max-tokens` is not one."""
    words = flag.lstrip("-").lower().replace("_", "-").split("-")
    return any(w in ("key", "apikey", "token", "secret", "password", "passwd") for w in words)


def redact_env(env: dict[str, str]) -> dict[str, str]:
    """A copy of `env` with secret values replaced by "<redacted>"."""
    return {k: (REDACTED if is_secret(k) else v) for k, v in env.items()}


def redact_argv(argv: list[str]) -> list[str]:
    """A copy of `argv` where the value after a secret-looking flag (`--api-key X`, `--token=X`) is redacted."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append(REDACTED)
            hide_next = False
        elif arg.startswith("-") and "=" in arg and is_secret_flag(arg.split("=", 1)[0]):
            out.append(arg.split("=", 1)[0] + "=" + REDACTED)
        elif arg.startswith("-") and is_secret_flag(arg):
            out.append(arg)
            hide_next = True
        else:
            out.append(arg)
    return out
