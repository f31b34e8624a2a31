"""POST /v1/embeddings: its models, serving and route."""
