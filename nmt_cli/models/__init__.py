"""Transformer models and the registry of named presets."""
