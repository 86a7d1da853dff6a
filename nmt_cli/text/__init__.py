"""Text processing: normalization, Moses tokenization, BPE, cleaning."""
