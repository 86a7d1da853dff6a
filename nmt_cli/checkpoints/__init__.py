"""Checkpoints: the file format (atomic save, safe load, checks), file names, averaging."""
