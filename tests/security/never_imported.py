"""A module nothing imports (tests/security/test_python_callables.py): if it ever appears in
sys.modules after a definition naming it was validated, validation imported it."""


def tripwire(input, upstream):
    """A plain function, so only the missing registration can refuse it."""
    return {"tripped": True}
