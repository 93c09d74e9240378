"""One role's attributed profile as the campaign stores it in the traces table, and reads it back."""

from __future__ import annotations

from dataclasses import dataclass

from rooftop.profile.summary import ProfileSummary


@dataclass(slots=True)
class StoredProfile:
    """The profile package's summary of a role's trace, with what the campaign knows of it: the role,
    which steps the trace holds, and every rank's row where the server ran on several GPUs."""

    summary: ProfileSummary  # its notes hold the campaign's too (no eager map, ranks that lag)
    role: str = "single"  # single | prefill | decode
    measured: str = ""  # "the steps as served (CUDA graphs), attributed through an eager run ...", "... (eagerly)"
    ranks: list[dict] | None = None  # profile.ranks.rank_table rows, rank 0 first; None for one trace

    def to_json_dict(self) -> dict:
        """The summary's JSON (`rooftop profile --json`) with the campaign's keys beside its own."""
        out = {**self.summary.to_json_dict(), "role": self.role, "measured": self.measured}
        if self.ranks is not None:
            out["ranks"] = self.ranks
        return out

    @classmethod
    def from_json_dict(cls, d: dict) -> StoredProfile:
        """What `to_json_dict` wrote; a trace stored before pd was profiled has no role (it was the only one)."""
        return cls(ProfileSummary.from_json_dict(d), d.get("role", "single"), d.get("measured", ""), d.get("ranks"))
