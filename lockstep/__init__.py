"""Lockstep: what users import and type (placeholder; the migration branch owns this file)."""
