"""OpenAI's Responses API (/v1/responses), built on chat: its models, the request as a chat
request, the stream's events, the store of responses, serving and routes."""
