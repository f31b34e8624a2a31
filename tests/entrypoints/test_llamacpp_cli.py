"""llama-server's flags on `minivllm serve`: refused by name with minivllm's flag for the job,
hidden from --help; the flags both spell the same still work."""

from __future__ import annotations

import pytest

from minivllm.cli import build_parser
from minivllm.entrypoints.llamacpp.cli_flags import FLAGS


@pytest.mark.parametrize("argv, says", [
    (["-c", "4096"], "--max-model-len"), (["--ctx-size", "4096"], "--max-model-len"),
    (["-np", "4"], "--max-num-seqs"), (["-t", "2"], "--engine-threads"),
    (["-ngl", "99"], "--device"), (["-m", "x.gguf"], "minivllm serve FILE.gguf"),
    (["--jinja"], "always Jinja"), (["-a", "coder"], "--served-model-name"),
    (["-ctk", "q8_0"], "--kv-cache-dtype"), (["--mlock"], "no counterpart"),
])
def test_llama_server_flags_name_minivllms(argv, says, capsys):
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["serve", "model.gguf", *argv])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert f"{argv[0]} is llama-server's flag" in err and says in err


def test_shared_flags_work_and_help_hides_theirs(capsys):
    args = build_parser().parse_args(["serve", "model.gguf", "--host", "0.0.0.0", "--port",
                                      "8080", "--api-key", "k", "--seed", "3"])
    assert (args.host, args.port, args.api_key, args.seed) == ("0.0.0.0", 8080, "k", 3)
    assert not any(name.startswith("llama_server") for name in vars(args))
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--help"])
    shown = capsys.readouterr().out
    assert "--ctx-size" not in shown and "-ngl" not in shown
    assert len({s for spellings, _ in FLAGS for s in spellings}) == sum(
        len(spellings) for spellings, _ in FLAGS)  # no spelling twice
