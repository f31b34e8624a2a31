"""POST /v1/completions: its models, serving (with vLLM's beam search) and route."""
