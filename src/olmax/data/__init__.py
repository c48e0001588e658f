"""Tokenization, OLMo-core-identical instances and order, and the Grain loader (docs/data.md)."""
