"""import-fairseq: a fairseq checkpoint, dictionaries and BPE codes become a run directory."""
