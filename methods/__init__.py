"""Training methods: one module per method behind one training interface.

``methods/core`` holds what every method shares (policy, rollout engine, the
training loop that owns the rollout budget, warm start, evaluation); each
method module (``methods/grpo.py``, ...) registers itself with
:func:`methods.core.registry.register_method` and supplies only what differs.
"""
