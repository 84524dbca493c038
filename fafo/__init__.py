"""fafo-bench: a harness for draftless, lossless LLM decoders (FAFO and its baselines)."""

__version__ = "0.1.0"
