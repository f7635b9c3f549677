"""Steering the tiers from what a turn says: drift detection (`drift`) and the coordinator
(`hcac`) that runs the dialogue state machine and decides what each tier keeps or drops, on a
session's memory (`session_memory`)."""
