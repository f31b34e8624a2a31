"""Linear layers: one module per implementation (onednn.py, panels.py, amx.py, int8.py,
gguf.py), the measured choice between them per row count (choice.py), and the registry that
picks one for a weight (registry.py; how to add a format is there)."""
