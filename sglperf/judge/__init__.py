"""Verdicts on measured levels: floors, the KV plateau, the config A/B and latency ceilings, decided by intervals.
Pure functions over records: nothing here knows HTTP or pytest."""
