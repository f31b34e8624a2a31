"""CPU fast paths: the C kernels (the .c and .h files here), built for this CPU's
instruction-set level (isa.py, its name: processor.py) by build.py, which binds the
functions kernels.h declares (declarations.py); the library and what it runs here
(library.py), asked by the torch-facing wrappers of each kernel family: attention_ops.py,
fused_ops.py, sampler_ops.py, lora_ops.py, linear_ops.py and gguf_ops.py (the linears that
run on these are model/linear/); GGUF block layouts (gguf_blocks.py); and the intra-op
thread governor (threads.py).

Each kernel has a pure-torch reference it is tested against. MINIVLLM_DISABLE_KERNELS=1
turns them all off (library.enabled(): the reference paths then run everywhere).
"""
