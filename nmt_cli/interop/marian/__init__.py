"""import-marian: a Hugging Face MarianMTModel directory (OPUS-MT) becomes a run directory."""
