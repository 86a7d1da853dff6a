"""Data: dictionaries, binarized corpora and batching."""
