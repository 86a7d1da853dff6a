"""preprocess: raw parallel text to a data-bin (normalize, tokenize, clean, BPE, dictionary, binarize)."""
