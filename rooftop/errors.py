"""The one error type a user can cause: it carries what went wrong and how to fix it."""


class RooftopError(Exception):
    """A user-facing error: `problem` names the thing, `fix` says what to do about it."""

    def __init__(self, problem: str, fix: str = ""):
        super().__init__(problem)
        self.problem = problem
        self.fix = fix

    def __str__(self) -> str:
        return f"{self.problem} — {self.fix}" if self.fix else self.problem
