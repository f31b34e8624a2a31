"""Ollama's API (/api/chat, /api/generate, /api/embed, /api/tags, /api/show, /api/ps,
/api/version), served over the same engine as the OpenAI routes."""
