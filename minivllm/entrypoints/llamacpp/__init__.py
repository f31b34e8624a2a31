"""llama.cpp's llama-server native API (/completion, /infill, /props, /slots), served over
the same engine as the OpenAI routes."""
