"""Entry point of Dramatiq worker processes: ``dramatiq flowforge.worker``.

Sets Django up (the engine app's ``ready()`` builds the broker: ``flowforge.broker.setup``),
sets the broker up explicitly (the same one, returned again), then imports the actors,
which Dramatiq's worker finds declared on that broker.
"""

import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "flowforge.settings")
django.setup()

from flowforge.broker import setup  # noqa: E402

broker = setup()

from engine import actors  # noqa: E402,F401  (declares the actors on ``broker``)
