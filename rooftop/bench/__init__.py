"""Load generation, per-request records, statistics, knee detection and client calibration."""
