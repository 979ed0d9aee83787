"""Desired + actual + capacity -> ordered actions with reasons. Pure: no I/O, no clock, no randomness."""
