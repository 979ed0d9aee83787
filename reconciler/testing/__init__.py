"""Test and demo helpers: a private Ray head, a tiny random-weight Llama, the embedding model.

Nothing in the reconciler imports this package; tests and ``make demo`` do.
"""
