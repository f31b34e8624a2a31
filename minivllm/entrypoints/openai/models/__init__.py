"""The models the server answers to (the base model, LoRA adapters): GET /v1/models and the
runtime LoRA routes."""
