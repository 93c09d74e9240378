"""What every stage of a block is given: the campaign, its store, and the console and progress bar to speak on."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from rooftop.campaign.store import Store
from rooftop.spec.campaign import CampaignSpec


@dataclass(slots=True)
class StageContext:
    """The campaign a stage runs for, where it stores what it measures, and how it tells the user."""

    spec: CampaignSpec
    store: Store
    say: Callable[[str], None]  # one plain line on the console, above the progress bar
    stage: Callable[[str], None]  # what the block runs now, on the progress bar
    said: set[str] = field(default_factory=set)  # what was said once for the whole campaign (shared by its blocks)

    @property
    def run_dir(self) -> Path:
        return self.store.run_dir

    def say_once(self, key: str, text: str) -> None:
        """Say `text` unless something under `key` was said before in this campaign."""
        if key not in self.said:
            self.said.add(key)
            self.say(text)
