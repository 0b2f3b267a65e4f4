"""Aggregation: FedAvg and the server optimizers over a kernel, and the robust options (pure functions)."""
