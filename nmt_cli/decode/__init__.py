"""Decoding: beam search and the text-to-text translator."""
