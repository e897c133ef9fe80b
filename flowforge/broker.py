"""Dramatiq broker wiring, chosen by ``settings.BROKER_URL``.

``redis://`` (the default) selects the Redis broker; ``amqp://`` selects RabbitMQ
with publisher confirms (``confirm_delivery=True``), so ``enqueue`` returning means
the broker has the message. Import this module before declaring actors.
"""

from __future__ import annotations

import importlib
import os

import dramatiq
from django.conf import settings
from dramatiq.middleware import AgeLimit, Callbacks, Pipelines, Retries, ShutdownNotifications, TimeLimit

from flowforge.dramatiq_middleware import DjangoConnectionMiddleware


def build_broker(url: str | None = None, *, namespace: str | None = None) -> dramatiq.Broker:
    """Return a broker for ``url`` (default ``settings.BROKER_URL``).

    Raises ValueError naming the URL when its scheme is neither redis(s) nor amqp(s).
    """
    url = url or settings.BROKER_URL
    namespace = namespace or settings.BROKER_NAMESPACE
    middleware = [
        AgeLimit(),
        TimeLimit(),
        ShutdownNotifications(),
        Callbacks(),
        Pipelines(),
        Retries(max_retries=3, min_backoff=200, max_backoff=5_000),
        DjangoConnectionMiddleware(),
    ]
    # Extra middleware by dotted path (fault injection in tests/faults uses this).
    for dotted in filter(None, os.environ.get("FLOWFORGE_BROKER_MIDDLEWARE", "").split(",")):
        module_name, _, attr = dotted.strip().rpartition(".")
        middleware.append(getattr(importlib.import_module(module_name), attr)())
    if url.startswith(("redis://", "rediss://", "unix://")):
        from dramatiq.brokers.redis import RedisBroker

        return RedisBroker(url=url, namespace=namespace, middleware=middleware)
    if url.startswith(("amqp://", "amqps://")):
        from dramatiq.brokers.rabbitmq import RabbitmqBroker

        return RabbitmqBroker(url=url, confirm_delivery=True, middleware=middleware)
    raise ValueError(f"BROKER_URL {url!r}: expected a redis:// or amqp:// URL")


broker = build_broker()
dramatiq.set_broker(broker)
