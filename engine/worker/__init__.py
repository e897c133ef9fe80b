"""The worker: what a worker process does with an execute message.

Read in this order:

- ``execute``   — one message: start, heartbeat, handler, output, completion, continuation
                  (the flow diagram of an attempt is in its docstring).
- ``batching``  — ``Completer``: the one way starts and completions are recorded;
                  ``InlineCompleter`` (tests) and ``BatchCompleter`` (production, write-behind).
- ``combiner``  — the generic ``Combiner`` behind ``BatchCompleter`` (threads only, no database).
- ``heartbeat`` — the thread that keeps running attempts' leases alive and flags lost ones.
- ``handoff``   — the thread that hands a slow message's waiting generations back to the broker.
- ``output``    — a handler's output as stored JSON text (size and JSON checks), error text cut short.

The worker sits above the relay (``publish_dispatches``) and ``engine.dispatch`` (messages by
actor name, the lease owner string) and below ``engine.actors``, which it never imports.
"""
