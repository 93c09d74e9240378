"""Process supervision and launch scripts; knows nothing of engine flags."""

from rooftop.launch.scripts import launch_script
from rooftop.launch.supervisor import ProcessSpec, RunningProcess, Supervisor, reap_leftovers

__all__ = ["ProcessSpec", "RunningProcess", "Supervisor", "launch_script", "reap_leftovers"]
