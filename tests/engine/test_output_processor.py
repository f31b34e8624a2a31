"""OutputProcessor: the core's per-step token deltas (EngineCoreOutputs) in, RequestOutputs
out -- detokenized, in each request's output kind (delta, cumulative, final only), ended at
stop strings (reported back as stopped), n sequences and best_of's pick, aborts and errors,
and the step's statistics. With a word-level tokenizer: token i is the word "w<i>"."""

from __future__ import annotations

import pytest

from minivllm.engine.messages import EngineCoreOutput, EngineCoreOutputs, EngineCoreRequest
from minivllm.engine.output_processor import OutputProcessor
from minivllm.sampling_params import RequestOutputKind, SamplingParams
from tests.model_factory import word_tokenizer

PROMPT = [3, 4]  # "w3 w4"


@pytest.fixture(scope="module")
def tokenizer():
    return word_tokenizer()


def processor(tokenizer, request_id: str = "r", core_params: SamplingParams | None = None,
              **params) -> OutputProcessor:
    """An OutputProcessor tracking one request; `core_params`: what the core was sent, where
    it differs from the caller's."""
    caller = SamplingParams(**params)
    out = OutputProcessor(tokenizer)
    out.add_request(EngineCoreRequest(request_id, PROMPT, core_params or caller, 0.0),
                    "w3 w4", caller)
    return out


def step(proc: OutputProcessor, *outputs: EngineCoreOutput, now: float = 1.0):
    return proc.process_outputs(EngineCoreOutputs(timestamp=now, outputs=list(outputs)))


def tokens(ids: list[int], finish: str | None = None, index: int = 0, request_id: str = "r",
           logprob: float | None = None, **fields) -> EngineCoreOutput:
    new_logprobs = None
    if logprob is not None:  # each sampled token, with that logprob, rank 1
        new_logprobs = [([t], [logprob], [1]) for t in ids]
    return EngineCoreOutput(request_id, index, ids, new_logprobs=new_logprobs,
                            finish_reason=finish, **fields)


def words(ids: list[int]) -> str:
    return "".join(f" w{i}" for i in ids)


# ---- output kinds ---------------------------------------------------------------------------

def test_delta_outputs_carry_only_what_is_new(tokenizer):
    proc = processor(tokenizer, max_tokens=4, output_kind=RequestOutputKind.DELTA)
    texts, ids = [], []
    for new, finish in [([5], None), ([6, 7], None), ([8], "length")]:
        (output,) = step(proc, tokens(new, finish)).request_outputs
        (completion,) = output.outputs
        assert completion.token_ids == new
        texts.append(completion.text)
        ids += completion.token_ids
        assert output.finished is (finish is not None)
        assert completion.finish_reason == finish
    assert "".join(texts) == words([5, 6, 7, 8]) and ids == [5, 6, 7, 8]
    assert not proc.has_unfinished_requests()


def test_cumulative_outputs_carry_everything_so_far(tokenizer):
    proc = processor(tokenizer, max_tokens=3, output_kind=RequestOutputKind.CUMULATIVE)
    (first,) = step(proc, tokens([5])).request_outputs
    assert first.outputs[0].token_ids == [5] and first.outputs[0].text == words([5])
    (last,) = step(proc, tokens([6, 7], "length")).request_outputs
    assert last.outputs[0].token_ids == [5, 6, 7] and last.outputs[0].text == words([5, 6, 7])
    assert last.finished and last.prompt_token_ids == PROMPT and last.prompt == "w3 w4"


def test_final_only_answers_once_when_finished(tokenizer):
    proc = processor(tokenizer, max_tokens=3, output_kind=RequestOutputKind.FINAL_ONLY)
    assert step(proc, tokens([5])).request_outputs == []
    assert step(proc, tokens([6])).request_outputs == []
    (final,) = step(proc, tokens([7], "length")).request_outputs
    assert final.finished and final.outputs[0].token_ids == [5, 6, 7]
    assert final.outputs[0].text == words([5, 6, 7])


def test_a_stop_token_from_the_core_is_reported_with_its_id(tokenizer):
    proc = processor(tokenizer, max_tokens=8)
    (output,) = step(proc, tokens([5, 2], "stop", stop_reason=2)).request_outputs
    completion = output.outputs[0]
    assert (completion.finish_reason, completion.stop_reason) == ("stop", 2)
    assert completion.text == words([5])  # </s> is a special token: skipped


# ---- stop strings ---------------------------------------------------------------------------

def test_a_stop_string_ends_the_sequence_and_is_reported_as_stopped(tokenizer):
    proc = processor(tokenizer, max_tokens=8, stop=["w7"], output_kind=RequestOutputKind.DELTA)
    (first,) = step(proc, tokens([5])).request_outputs
    # Text that a stop string could still begin with is held back until it is decided.
    assert words([5]).startswith(first.outputs[0].text) and first.outputs[0].text != words([5])
    result = step(proc, tokens([6, 7, 8]))
    assert result.stopped == ["r"]  # the caller aborts it in the core
    (output,) = result.request_outputs
    assert first.outputs[0].text + output.outputs[0].text == words([5, 6]) + " "
    assert output.outputs[0].token_ids == [6, 7]  # what came after the stop is dropped
    assert (output.outputs[0].finish_reason, output.outputs[0].stop_reason) == ("stop", "w7")
    assert output.finished
    # The core lagged one step behind: what it still sends for the request is dropped.
    late = step(proc, tokens([9]))
    assert late.request_outputs == [] and late.stopped == []


def test_a_stop_string_can_be_kept_in_the_output(tokenizer):
    proc = processor(tokenizer, max_tokens=8, stop=["w6"], include_stop_str_in_output=True)
    (output,) = step(proc, tokens([5, 6, 7])).request_outputs
    assert output.outputs[0].text == words([5, 6]) and output.outputs[0].finish_reason == "stop"


def test_stop_strings_wait_for_min_tokens(tokenizer):
    proc = processor(tokenizer, max_tokens=8, stop=["w5"], min_tokens=3)
    (output,) = step(proc, tokens([5, 6, 5])).request_outputs
    assert output.outputs[0].finish_reason == "stop"
    assert output.outputs[0].token_ids == [5, 6, 5]  # the first w5 came too early to stop
    assert output.outputs[0].text == words([5, 6]) + " "


# ---- n and best_of --------------------------------------------------------------------------

def test_n_sequences_share_one_output_and_finish_together(tokenizer):
    proc = processor(tokenizer, n=2, max_tokens=2, output_kind=RequestOutputKind.CUMULATIVE)
    (output,) = step(proc, tokens([5], index=0), tokens([6], index=1)).request_outputs
    assert [c.token_ids for c in output.outputs] == [[5], [6]] and not output.finished
    (output,) = step(proc, tokens([7], "length", index=0)).request_outputs
    assert not output.finished  # its sibling is still going
    result = step(proc, tokens([8], "length", index=1))
    (output,) = result.request_outputs
    assert output.finished and [c.token_ids for c in output.outputs] == [[5, 7], [6, 8]]
    assert [c.index for c in output.outputs] == [0, 1]
    assert result.iteration_stats.finished_requests[0].num_generation_tokens == 4


def test_a_stop_string_in_one_of_n_names_that_sequence(tokenizer):
    proc = processor(tokenizer, n=2, max_tokens=4, stop=["w9"])
    assert step(proc, tokens([9], index=1), tokens([5], index=0)).stopped == ["r#1"]


def test_best_of_answers_only_at_the_end_with_the_most_likely(tokenizer):
    """The caller asked for n=1 of best_of=3 without logprobs; the core was sent logprobs=0,
    which best_of needs to rank the sequences."""
    caller = dict(n=1, best_of=3, max_tokens=2, output_kind=RequestOutputKind.DELTA)
    proc = processor(tokenizer, core_params=SamplingParams(**caller, logprobs=0), **caller)
    logprobs = {0: -3.0, 1: -0.5, 2: -2.0}
    first = step(proc, *(tokens([5 + i], index=i, logprob=lp) for i, lp in logprobs.items()))
    assert first.request_outputs == []
    last = step(proc, *(tokens([10 + i], "length", index=i, logprob=lp)
                        for i, lp in logprobs.items()))
    (output,) = last.request_outputs
    (best,) = output.outputs
    assert best.token_ids == [6, 11] and best.cumulative_logprob == pytest.approx(-1.0)
    assert best.index == 0 and best.logprobs is None  # the caller did not ask for them
    assert output.finished


# ---- aborts, errors, statistics -------------------------------------------------------------

def test_an_aborted_request_answers_once_more_as_aborted(tokenizer):
    proc = processor(tokenizer, max_tokens=8, output_kind=RequestOutputKind.DELTA)
    step(proc, tokens([5]))
    proc.abort_requests(["r", "unknown"])
    result = step(proc, tokens([6]))  # the core's token for it is dropped
    (output,) = result.request_outputs
    assert output.finished and output.outputs[0].finish_reason == "abort"
    assert output.outputs[0].token_ids == [] and output.error is None
    assert result.iteration_stats.finished_requests[0].finish_reason == "abort"
    assert not proc.has_unfinished_requests() and step(proc).request_outputs == []


def test_a_core_error_finishes_the_request_with_it(tokenizer):
    proc = processor(tokenizer, max_tokens=8)
    (output,) = step(proc, EngineCoreOutput("r", error="boom", error_kind="failed")
                     ).request_outputs
    assert output.finished and output.error == "boom"
    assert not proc.has_unfinished_requests()


def test_iteration_stats_time_the_first_token_and_the_gaps(tokenizer):
    proc = processor(tokenizer, max_tokens=3)
    first = step(proc, tokens([5], first_scheduled_time=0.25), now=1.0).iteration_stats
    assert first.time_to_first_tokens == [1.0] and first.num_generation_tokens == 1
    second = step(proc, tokens([6, 7], "length"), now=1.5).iteration_stats
    assert second.inter_token_latencies == [0.5] and second.num_generation_tokens == 2
    (finished,) = second.finished_requests
    assert finished.finish_reason == "length" and finished.num_prompt_tokens == 2
    assert finished.queue_time == 0.25 and finished.e2e_latency == 1.5
    assert finished.prefill_time == 0.75 and finished.decode_time == 0.5
