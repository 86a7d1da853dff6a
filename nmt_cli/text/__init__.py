"""Text processing shared by preprocess and translate: strict line reading, normalization and Moses tokenization, BPE."""
