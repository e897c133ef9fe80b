"""The append-only audit log (built out by the audit issue)."""
