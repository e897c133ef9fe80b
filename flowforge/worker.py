"""Entry point of Dramatiq worker processes: ``dramatiq flowforge.worker``.

Sets Django up, then imports the broker and the actors.
"""

import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "flowforge.settings")
django.setup()

from engine import actors  # noqa: E402,F401  (imports flowforge.broker first)
