"""Fuzzing: every parser and decoder on arbitrary and mutated input (hypothesis)."""
