"""nmt models as CTranslate2 model directories (export.py) and the extra they need (extra.py)."""
