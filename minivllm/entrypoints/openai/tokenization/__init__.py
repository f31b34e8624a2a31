"""vLLM's /tokenize, /detokenize and /tokenizer_info."""
