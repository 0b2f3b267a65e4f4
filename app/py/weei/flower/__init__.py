"""Weei on Flower (docs/flower.md): a Flower grid as one more transport for Weei's coordinator.

Optional: needs the ``flower`` extra (``flwr[simulation]``). Nothing below ``weei.flower`` imports it.
"""
