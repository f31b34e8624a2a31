"""A newcomer's mistakes end with the message, not a traceback: the CLI prints it and exits 2
(argparse's status for usage errors); --debug or --log-level debug shows the traceback."""

from __future__ import annotations

import subprocess
import sys

import pytest

from minivllm import LLM
from minivllm.cli import main


@pytest.mark.parametrize("argv, message", [
    (["serve", "--num-kv-blocks", "0"], "num_kv_blocks must be >= 1, got 0"),
    (["serve", "--chat-template", "no-such-template.jinja"],
     "--chat-template: no such file: no-such-template.jinja"),
    (["generate", "--model", "/no/such/model", "hello"],
     "model '/no/such/model' is neither a local directory nor a loadable hub id"),
    (["serve", "--lora-modules", "a=/somewhere"], "--lora-modules needs --enable-lora"),
    (["serve", "--runner", "draft"], "runner (--runner) must be one of auto, generate, "
                                     "pooling, got 'draft'"),
    (["serve", "--convert", "classify"], "convert (--convert) must be one of auto, none, "
                                         "embed"),
    (["serve", "--runner", "generate", "--convert", "embed"], "needs --runner pooling or auto"),
    (["serve", "--kv-offloading-backend", "disk"],
     "kv_offloading_path (--kv-offloading-path) must name a folder"),
    (["serve", "--kv-offloading-backend", "disk", "--kv-offloading-path", "d",
      "--kv-offloading-size", "-1"], "kv_offloading_size (--kv-offloading-size) must be > 0"),
    (["serve", "--enable-lora", "--lora-modules", "a"], "must be name=path or a JSON object"),
    (["bench", "serve", "--backend", "openai-chat", "--endpoint", "completions"],
     "--backend openai-chat contradicts --endpoint completions"),
])
def test_a_bad_flag_or_path_is_a_message_and_exit_2(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_debug_or_a_debug_log_level_shows_the_traceback():
    for flag in (["--debug"], ["--log-level", "debug"]):
        with pytest.raises(ValueError, match="num_kv_blocks must be >= 1"):
            main(["serve", "--num-kv-blocks", "0", *flag])


def test_the_installed_command_exits_2_without_a_traceback():
    proc = subprocess.run([sys.executable, "-m", "minivllm.cli", "serve",
                           "--chat-template", "missing.jinja"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2
    assert "minivllm serve: error: --chat-template: no such file" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_chat_without_a_template_says_how_to_give_one(stories_dir):
    llm = LLM(model=str(stories_dir), num_kv_blocks=16, swap_space=0.01)
    with pytest.raises(ValueError, match="no chat template: pass one, llm.chat"):
        llm.chat([{"role": "user", "content": "Hi"}])
    template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    out = llm.chat([{"role": "user", "content": "Once upon a time"}], chat_template=template,
                   use_tqdm=False)
    assert out[0].prompt_token_ids == llm.get_tokenizer().encode("Once upon a time",
                                                                 add_special_tokens=False)
