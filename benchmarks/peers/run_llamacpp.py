"""Peer runner: llama.cpp through llama-cpp-python's low-level C API, greedy on the given
token-id prompts. Run with the peer's own venv python (peers/llamacpp); same protocol as the
other runners: a JSON spec on stdin, one `RESULT {batch: {elapsed_s, output_tokens}}` line.

The Hugging Face model is first converted to GGUF by to_gguf.py and cached beside the model
directory (<model dir>-f32.gguf).

What "batch B" means for llama.cpp: B sequences decoded together in one llama_context, the
way llama.cpp's own batched / parallel examples and its server do it. The context has
n_seq_max = B and one KV stream per sequence (kv_unified off, n_ctx = B * max_model_len, so
every sequence gets max_model_len cells). The B prompts (seq ids 0..B-1) are prefilled
through llama_batch chunks of up to n_batch = 2048 tokens; then every step is ONE
llama_decode of a llama_batch holding each sequence's last token (B tokens), and each
sequence's next token is the argmax of its row of logits. EOS is ignored: exactly
output_len tokens per sequence. Batch 1 is the same loop with B = 1. Timed: prefill and
decode of the B requests; not timed: model load, context creation, a warm-up decode.

Knobs (environment). The defaults are the fp32 configuration whose greedy tokens equal
transformers' fp32 ones (see --check): LLAMACPP_DTYPE f32 | bf16 | q8_0 (GGUF weights);
LLAMACPP_KV f32 | f16 (KV cache; f16 is llama.cpp's own default); LLAMACPP_FLASH_ATTN
off | auto | on (llama.cpp's CPU flash attention computes in reduced precision, so greedy
tokens drift from fp32 references after a few steps); LLAMACPP_THREADS (default: the
cores this process may use). llama.cpp's own defaults are LLAMACPP_KV=f16
LLAMACPP_FLASH_ATTN=auto.

    peers/llamacpp/bin/python benchmarks/peers/run_llamacpp.py --check [MODEL_DIR]

checks the conversion instead: greedy tokens from llama.cpp (batch 1 and batch 4) against
transformers' greedy tokens on the same ids, transformers run by the main venv's python.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import llama_cpp as lc
import numpy as np
from to_gguf import ensure_gguf  # this folder's: the runner runs in the peer's venv

ROOT = Path(__file__).resolve().parents[2]
GGML_TYPES = {"f32": 0, "f16": 1}  # ggml_type values for the KV cache
FLASH_ATTN = {"auto": -1, "off": 0, "on": 1}  # llama_flash_attn_type values
PREFILL_CHUNK = 2048


def _amx_cpu() -> bool:
    """llama-cpp-python 0.3.36 built for an AMX CPU (GGML_NATIVE) repacks Q4 / Q8 weights for
    its AMX kernels, which die of SIGILL at their first tile instruction here (a Xeon with
    amx_tile, from Python, with or without the process's tile permission asked first). Its
    other extra buffer types go with them: on such a CPU llama.cpp runs its AVX-512 kernels
    on the weights as stored."""
    return platform.machine() == "x86_64" and "amx_tile" in Path("/proc/cpuinfo").read_text()


@lc.llama_log_callback
def _quiet(level, text, user_data):  # llama.cpp's logging: only warnings and errors
    if level in (2, 3):  # GGML_LOG_LEVEL_WARN, GGML_LOG_LEVEL_ERROR
        sys.stderr.write(text.decode(errors="replace"))


class LlamaCpp:
    """A GGUF model loaded once; `generate` runs B prompts as B sequences of one context."""

    def __init__(self, gguf: Path, threads: int, kv: str = "f32",
                 flash_attn: str = "off") -> None:
        lc.llama_log_set(_quiet, None)
        lc.llama_backend_init()
        params = lc.llama_model_default_params()
        params.use_extra_bufts = not _amx_cpu()
        self.model = lc.llama_model_load_from_file(str(gguf).encode(), params)
        if not self.model:
            raise RuntimeError(f"llama.cpp could not load {gguf}")
        self.n_vocab = lc.llama_vocab_n_tokens(lc.llama_model_get_vocab(self.model))
        self.threads, self.kv, self.flash_attn = threads, kv, flash_attn

    def _context(self, n_seq: int, max_model_len: int):
        p = lc.llama_context_default_params()
        p.n_ctx = n_seq * max_model_len
        p.n_batch = PREFILL_CHUNK
        p.n_seq_max = n_seq
        p.kv_unified = False
        p.n_threads = p.n_threads_batch = self.threads
        p.type_k = p.type_v = GGML_TYPES[self.kv]
        p.flash_attn_type = FLASH_ATTN[self.flash_attn]
        ctx = lc.llama_init_from_model(self.model, p)
        if not ctx:
            raise RuntimeError("llama.cpp could not create a context")
        return ctx

    def _decode(self, ctx, batch, tokens, pos, seqs, logits) -> np.ndarray:
        """One llama_decode of the given tokens; the argmax of every requested row."""
        for i, (t, p, s, lg) in enumerate(zip(tokens, pos, seqs, logits)):
            batch.token[i], batch.pos[i] = t, p
            batch.n_seq_id[i], batch.seq_id[i][0], batch.logits[i] = 1, s, lg
        batch.n_tokens = len(tokens)
        rc = lc.llama_decode(ctx, batch)
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}")
        n_out = sum(bool(x) for x in logits)
        if not n_out:
            return np.empty(0, dtype=np.int64)
        ptr = lc.llama_get_logits(ctx)  # the requested rows, contiguous, in batch order
        return np.ctypeslib.as_array(ptr, shape=(n_out, self.n_vocab)).argmax(axis=1)

    def generate(self, prompts: list[list[int]], output_len: int, max_model_len: int,
                 warmup: bool = True) -> tuple[list[list[int]], float]:
        """Greedy, EOS ignored: output_len tokens per prompt; (tokens, seconds)."""
        n = len(prompts)
        ctx = self._context(n, max_model_len)
        batch = lc.llama_batch_init(max(PREFILL_CHUNK, n), 0, 1)
        try:
            if warmup:  # page in the weights and run the kernels once, then forget it
                k = min(8, len(prompts[0]))
                self._decode(ctx, batch, prompts[0][:k], range(k), [0] * k, [0] * (k - 1) + [1])
                lc.llama_memory_clear(lc.llama_get_memory(ctx), True)
            start = time.perf_counter()
            flat = [(t, p, s, p == len(prompt) - 1)
                    for s, prompt in enumerate(prompts) for p, t in enumerate(prompt)]
            first: list[int] = []
            for c in range(0, len(flat), PREFILL_CHUNK):
                chunk = flat[c:c + PREFILL_CHUNK]
                first += self._decode(ctx, batch, *zip(*chunk)).tolist()
            out = [[t] for t in first]
            seqs, want = list(range(n)), [True] * n
            for step in range(1, output_len):
                pos = [len(p) + step - 1 for p in prompts]
                nxt = self._decode(ctx, batch, [o[-1] for o in out], pos, seqs, want)
                for o, t in zip(out, nxt.tolist()):
                    o.append(t)
            elapsed = time.perf_counter() - start
        finally:
            lc.llama_batch_free(batch)
            lc.llama_free(ctx)
        return out, elapsed


def _threads() -> int:
    return int(os.environ.get("LLAMACPP_THREADS") or len(os.sched_getaffinity(0)))


def main() -> None:
    spec = json.loads(sys.stdin.read())
    # gguf_file: a GGUF file as it is (the one minivllm-gguf serves); else the model
    # directory converted at gguf_dtype
    gguf = (Path(spec["gguf_file"]) if spec.get("gguf_file") else
            ensure_gguf(Path(spec["model"]),
                        spec.get("gguf_dtype") or os.environ.get("LLAMACPP_DTYPE", "f32")))
    engine = LlamaCpp(gguf, _threads(), os.environ.get("LLAMACPP_KV", "f32"),
                      os.environ.get("LLAMACPP_FLASH_ATTN", "off"))
    results = {}
    for batch in spec["batch_sizes"]:
        outputs, elapsed = engine.generate(spec["prompts"][:batch], spec["output_len"],
                                           spec["max_model_len"])
        results[str(batch)] = {"elapsed_s": elapsed,
                               "output_tokens": sum(len(o) for o in outputs)}
    print("RESULT " + json.dumps(results), flush=True)


REFERENCE = """
import json, sys, torch
from transformers import AutoModelForCausalLM
spec = json.loads(sys.stdin.read())
model = AutoModelForCausalLM.from_pretrained(spec["model"], dtype=torch.float32).eval()
outs = []
with torch.inference_mode():
    for prompt in spec["prompts"]:  # plain greedy argmax with a KV cache, EOS ignored
        ids, past, toks = torch.tensor([prompt]), None, []
        for _ in range(spec["output_len"]):
            o = model(ids, past_key_values=past, use_cache=True)
            past, nxt = o.past_key_values, int(o.logits[0, -1].argmax())
            toks.append(nxt)
            ids = torch.tensor([[nxt]])
        outs.append(toks)
print("RESULT " + json.dumps(outs))
"""

# The benchmark model (init std 0.02, 30 layers) has nearly uniform attention and greedy
# output that repeats one token, so a wrong rotary layout could go unnoticed on it. The
# default check model has SmolLM-135M's widths, 4 layers and weights of std 0.3: peaked
# attention and varied tokens; converted without the q/k permutation it differs from the
# first generated token on.
MAKE_CHECK_MODEL = """
import shutil, sys, torch
from pathlib import Path
from minivllm.bench.models import SHAPES, save_random_model
from transformers import LlamaConfig, LlamaForCausalLM
bench = save_random_model("smollm-135m", Path(sys.argv[1]) / "results" / "smollm-135m-random")
torch.manual_seed(1)
config = LlamaConfig(**{**SHAPES["smollm-135m"], "num_hidden_layers": 4},
                     initializer_range=0.3, bos_token_id=1, eos_token_id=2)
LlamaForCausalLM(config).to(torch.float32).save_pretrained(sys.argv[2])
for name in ("tokenizer.json", "tokenizer_config.json"):
    shutil.copy(bench / name, Path(sys.argv[2]) / name)
"""


def check(model_dir: Path | None, python: Path, dtype: str, kv: str, flash_attn: str,
          n_prompts: int = 4, input_len: int = 32, output_len: int = 32) -> bool:
    """llama.cpp's greedy tokens (batch 1 and batch n_prompts) against transformers'."""
    with tempfile.TemporaryDirectory() as tmp:
        if model_dir is None:
            model_dir = Path(tmp) / "check-model"
            subprocess.run([str(python), "-c", MAKE_CHECK_MODEL, str(ROOT), str(model_dir)],
                           check=True, capture_output=True)
        rng = np.random.default_rng(0)
        prompts = rng.integers(3, 49152, size=(n_prompts, input_len)).tolist()
        spec = {"model": str(model_dir), "prompts": prompts, "output_len": output_len}
        proc = subprocess.run([str(python), "-c", REFERENCE], input=json.dumps(spec),
                              capture_output=True, text=True, check=True)
        ref = json.loads(proc.stdout.split("RESULT ", 1)[1])
        engine = LlamaCpp(ensure_gguf(model_dir, dtype), _threads(), kv, flash_attn)
        max_len = input_len + output_len
        single = [engine.generate([p], output_len, max_len)[0][0] for p in prompts]
        batched = engine.generate(prompts, output_len, max_len)[0]
    ok = True
    for name, got in (("batch 1", single), (f"batch {n_prompts}", batched)):
        for i, (g, r) in enumerate(zip(got, ref)):
            same = next((k for k, (a, b) in enumerate(zip(g, r)) if a != b), len(r))
            print(f"{name} prompt {i}: {same}/{len(r)} tokens equal to transformers"
                  + ("" if same == len(r) else f" (first difference at {same})"))
            ok &= same == len(r)
    print(f"transformers prompt 0: {ref[0]}\nllama.cpp    prompt 0: {batched[0]}")
    print(f"{model_dir}: weights {dtype}, KV {kv}, flash attention {flash_attn}: "
          + ("MATCH" if ok else "MISMATCH"))
    return ok


if __name__ == "__main__":
    if len(sys.argv) > 1:
        ap = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
        ap.add_argument("--check", nargs="?", type=Path, metavar="MODEL_DIR", const=False,
                        required=True, help="default: a 4-layer sharp-attention model")
        ap.add_argument("--reference-python", type=Path, default=ROOT / ".venv/bin/python")
        ap.add_argument("--dtype", choices=["f32", "bf16", "q8_0", "q4_0"], default="f32")
        ap.add_argument("--kv", choices=list(GGML_TYPES), default="f32")
        ap.add_argument("--flash-attn", choices=list(FLASH_ATTN), default="off")
        args = ap.parse_args()
        sys.exit(0 if check(args.check or None, args.reference_python, args.dtype, args.kv,
                            args.flash_attn) else 1)
    main()
