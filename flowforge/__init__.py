"""FlowForge's Django project package.

Named ``flowforge`` rather than ``platform``: a top-level ``platform`` package would
shadow the standard library module of that name and break ``import uuid``.
"""
