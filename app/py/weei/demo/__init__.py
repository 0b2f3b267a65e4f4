"""The built-in demo: a real federated job in one CPython process."""
