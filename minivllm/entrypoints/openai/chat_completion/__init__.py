"""POST /v1/chat/completions: its models, serving and route; tool calls and reasoning parsed
out of the text, and the flags that ask for them."""
