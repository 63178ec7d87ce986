"""Pure helpers for the probe mesh's records on the console side (see observations.py)."""
