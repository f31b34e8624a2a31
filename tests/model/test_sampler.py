"""The Sampler (minivllm/model/sampler.py): both paths, the batched torch one and the C
kernel (kernels/sampler.c), against an independent per-row float64 reference of vLLM's
semantics (chi-square tests whose null distribution is simulated), against each other
token for token, and for seeds, penalty state, min_tokens, greedy and logprobs."""

from collections import Counter

import pytest
import torch

from minivllm.model.kernels import library, sampler_ops
from minivllm.model.sampler import Sampler, request_key, top_logprobs, uniform
from minivllm.sampling_params import SamplingParams

KERNEL = library.available(torch.device("cpu"), torch.float32)
PATHS = [pytest.param(False, id="torch"),
         pytest.param(True, id="C", marks=pytest.mark.skipif(not KERNEL, reason="no kernels"))]
needs_kernel = pytest.mark.skipif(not KERNEL, reason="no C compiler: no kernels built")


def make_sampler(use_kernel: bool, vocab: int, seed: int = 0) -> Sampler:
    sampler = Sampler(vocab, torch.device("cpu"), seed, use_kernel)
    assert sampler.use_kernel == use_kernel
    return sampler


def reference_probs(logits: torch.Tensor, p: SamplingParams, prompt=(), output=(),
                    banned=()) -> torch.Tensor:
    """The distribution of one row's next token, written from the definitions (float64)."""
    x = logits.double().clone()
    if p.repetition_penalty != 1.0:
        seen = torch.tensor(sorted(set(prompt) | set(output)), dtype=torch.long)
        v = x[seen]
        x[seen] = torch.where(v > 0, v / p.repetition_penalty, v * p.repetition_penalty)
    for token, count in Counter(output).items():
        x[token] -= p.frequency_penalty * count + p.presence_penalty
    if len(output) < p.min_tokens:
        x[list(banned)] = float("-inf")
    if p.temperature == 0:
        return torch.nn.functional.one_hot(x.argmax(), len(x)).double()
    x = x / p.temperature
    if 0 < p.top_k < len(x):
        x[x < x.topk(p.top_k).values[-1]] = float("-inf")
    if p.top_p < 1.0:
        probs, order = x.softmax(-1).sort(descending=True)
        drop = probs.cumsum(-1) - probs >= p.top_p  # the token crossing top_p is kept
        x[order[drop]] = float("-inf")
    if p.min_p > 0.0:
        probs = x.softmax(-1)
        x[probs < p.min_p * probs.max()] = float("-inf")
    return x.softmax(-1)


def chi_square(counts: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
    """Pearson's statistic of counts [..., V] against probs [V], over probs' support."""
    support = probs > 0
    expected = probs[support] * counts.sum(-1, keepdim=True)
    return ((counts[..., support] - expected) ** 2 / expected).sum(-1)


def null_quantile(probs: torch.Tensor, n: int, q: float = 0.999, draws: int = 3000) -> float:
    """The q-quantile of the statistic of n draws from probs, simulated (expected counts
    can be small, so the chi-square law itself would be a poor approximation)."""
    gen = torch.Generator().manual_seed(123)
    samples = torch.multinomial(probs.float(), n * draws, replacement=True, generator=gen)
    counts = torch.zeros(draws, len(probs), dtype=torch.float64).scatter_add_(
        1, samples.view(draws, n), torch.ones(draws, n, dtype=torch.float64))
    return chi_square(counts, probs).quantile(q).item()


def first_tokens(use_kernel: bool, logits: torch.Tensor, params: SamplingParams, n: int,
                 prompt=(), output=(), banned=()) -> torch.Tensor:
    """n independent draws of a first token: n requests (own seeds), one row each."""
    sampler = make_sampler(use_kernel, len(logits))
    ids = [str(i) for i in range(n)]
    for i in ids:
        sampler.add_request(i, params, list(prompt), list(output), banned, seed=None)
    tokens = sampler.sample(logits.repeat(n, 1), ids).token_ids
    return torch.bincount(torch.tensor(tokens), minlength=len(logits)).double()


VOCAB, DRAWS = 40, 4000
LOGITS = torch.randn(VOCAB, generator=torch.Generator().manual_seed(7)) * 1.5
SETTINGS = {
    "temperature": dict(temperature=0.7),
    "top_k": dict(temperature=1.0, top_k=8),
    "top_p": dict(temperature=1.0, top_p=0.7),
    "min_p": dict(temperature=1.3, min_p=0.1),
    "combined": dict(temperature=0.8, top_k=20, top_p=0.9, min_p=0.05, repetition_penalty=1.3,
                     frequency_penalty=0.4, presence_penalty=0.3, min_tokens=5),
}
# The combined setting's history: penalized tokens, and banned ones (still under min_tokens).
HISTORY = dict(prompt=[0, 1, 2, 3, 5, 8, 13], output=[1, 1, 4, 21], banned=[6, 7])


@pytest.mark.parametrize("use_kernel", PATHS)
@pytest.mark.parametrize("setting", list(SETTINGS))
def test_first_tokens_follow_the_distribution(use_kernel, setting):
    params = SamplingParams(**SETTINGS[setting])
    history = HISTORY if setting == "combined" else {}
    probs = reference_probs(LOGITS, params, **history)
    counts = first_tokens(use_kernel, LOGITS, params, DRAWS, **history)
    assert counts[probs == 0].sum() == 0, "drew a token outside the allowed set"
    assert (probs > 0).sum() > 2 and (probs == 0).sum() > 0 or setting == "temperature"
    assert chi_square(counts, probs) <= null_quantile(probs, DRAWS)


@pytest.mark.parametrize("use_kernel", PATHS)
@pytest.mark.parametrize("peaked", [True, False])
def test_top_p_on_peaked_and_flat_rows(use_kernel, peaked):
    """The kernel takes top-p's threshold two ways: from candidates when few tokens carry
    the mass (peaked: 40 boosted tokens in 4096), from a histogram of the whole row when
    many do (flat): both must follow the distribution."""
    gen = torch.Generator().manual_seed(17)
    vocab = 16384 if peaked else 2048  # peaked: 40 boosted tokens in far fewer blocks
    logits = torch.randn(vocab, generator=gen) * 0.3
    if peaked:
        logits[torch.randperm(vocab, generator=gen)[:40]] += 12 + torch.randn(40, generator=gen)
    params = SamplingParams(temperature=0.9, top_p=0.8)
    probs = reference_probs(logits, params)
    counts = first_tokens(use_kernel, logits, params, DRAWS)
    kept = probs > 0
    assert counts[~kept].sum() == 0, "drew a token outside the allowed set"
    assert 2 < kept.sum() < len(probs)
    probs, counts = probs[kept] / probs[kept].sum(), counts[kept]
    assert chi_square(counts, probs) <= null_quantile(probs, DRAWS)


@pytest.mark.parametrize("use_kernel", PATHS)
def test_chi_square_rejects_a_wrong_distribution(use_kernel):
    """The test above can fail: draws at temperature 0.7 are rejected as temperature 0.85
    draws, and as top-p 0.7 draws when they were top-p 0.8 ones."""
    for truth, wrong in [(dict(temperature=0.7), dict(temperature=0.85)),
                         (dict(top_p=0.8), dict(top_p=0.7))]:
        counts = first_tokens(use_kernel, LOGITS, SamplingParams(**truth), DRAWS)
        probs = reference_probs(LOGITS, SamplingParams(**wrong))
        rejected = (counts[probs == 0].sum() > 0
                    or chi_square(counts, probs) > null_quantile(probs, DRAWS))
        assert rejected, (truth, wrong)


@pytest.mark.parametrize("use_kernel", PATHS)
def test_never_draws_outside_the_allowed_set(use_kernel):
    vocab, n = 3000, 1500
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(vocab, generator=gen) * 3
    banned = torch.randint(vocab, (50,), generator=gen).tolist() + [int(logits.argmax())]
    for kw in [dict(top_k=30), dict(top_p=0.5), dict(min_p=0.2), dict(top_k=200, top_p=0.9),
               dict(temperature=2.0, min_tokens=2)]:
        params = SamplingParams(**kw)
        allowed = reference_probs(logits, params, banned=banned) > 0
        counts = first_tokens(use_kernel, logits, params, n, banned=banned)
        assert counts[~allowed].sum() == 0, kw
        assert (counts > 0).sum() > 1, kw


def _run(sampler: Sampler, steps: list[torch.Tensor], rows: dict[str, int] | None = None,
         order_seed: int = 0) -> dict[str, list[int]]:
    """Samples each step's logits [R, V]: row rows[id] belongs to request id, and the rows
    are handed over in a shuffled order."""
    rows = rows or {"a": 0}
    gen = torch.Generator().manual_seed(order_seed)
    tokens: dict[str, list[int]] = {i: [] for i in rows}
    for logits in steps:
        ids = [list(rows)[j] for j in torch.randperm(len(rows), generator=gen).tolist()]
        out = sampler.sample(logits[[rows[i] for i in ids]].contiguous(), ids)
        for i, token in zip(ids, out.token_ids):
            tokens[i].append(token)
    return tokens


@pytest.mark.parametrize("use_kernel", PATHS)
def test_seeded_request_alone_in_a_batch_or_preempted(use_kernel):
    vocab = 500
    gen = torch.Generator().manual_seed(5)
    steps = [torch.randn(4, vocab, generator=gen) for _ in range(8)]
    params = SamplingParams(temperature=1.0, top_p=0.95, top_k=100)
    others = SamplingParams(temperature=0.5)

    alone = make_sampler(use_kernel, vocab, seed=1)
    alone.add_request("a", params, [1, 2], [], [], seed=1234)
    expected = _run(alone, [s[:1] for s in steps])["a"]

    for order_seed in range(3):  # with others, in shuffled orders, another engine seed
        batch = make_sampler(use_kernel, vocab, seed=order_seed + 2)
        for i in "xyz":
            batch.add_request(i, others, [3], [], [], seed=None)
        batch.add_request("a", params, [1, 2], [], [], seed=1234)
        got = _run(batch, steps, {"x": 1, "a": 0, "y": 2, "z": 3}, order_seed)
        assert got["a"] == expected

    # Preempted: left out of a few steps (the runner keeps it), then resumed.
    resumed = make_sampler(use_kernel, vocab)
    resumed.add_request("a", params, [1, 2], [], [], seed=1234)
    resumed.add_request("x", others, [3], [], [], seed=None)
    first = _run(resumed, steps[:3], {"a": 0, "x": 1})["a"]
    _run(resumed, steps[3:5], {"x": 1})
    rest = _run(resumed, steps[3:], {"a": 0, "x": 1})["a"]
    assert first + rest == expected

    # A seed is any int, used modulo 2**64.
    wrapped = make_sampler(use_kernel, vocab)
    wrapped.add_request("a", params, [1, 2], [], [], seed=1234 + 2 ** 64)
    assert _run(wrapped, [s[:1] for s in steps])["a"] == expected


@pytest.mark.parametrize("use_kernel", PATHS)
def test_different_seeds_differ_and_engine_seed_reproduces(use_kernel):
    vocab = 1000
    steps = [torch.zeros(1, vocab)] * 6  # uniform: any two sequences are unlikely to meet
    runs = []
    for seed in range(6):
        sampler = make_sampler(use_kernel, vocab)
        sampler.add_request("a", SamplingParams(), [], [], [], seed=seed)
        runs.append(tuple(_run(sampler, steps)["a"]))
    assert len(set(runs)) == len(runs)
    unseeded = []
    for engine_seed in (0, 0, 1):
        sampler = make_sampler(use_kernel, vocab, seed=engine_seed)
        sampler.add_request("a", SamplingParams(), [], [], [], seed=None)
        unseeded.append(_run(sampler, steps)["a"])
    assert unseeded[0] == unseeded[1] != unseeded[2]


@needs_kernel
def test_uniforms_match_between_c_and_python():
    keys = [request_key(s) for s in (0, 1, 2 ** 63 + 5, -7)]
    positions = [0, 1, 7, 1 << 40]
    signed = torch.tensor([k - (1 << 64) if k >= 1 << 63 else k for k in keys])
    got = sampler_ops.sampler_uniforms(signed, torch.tensor(positions)).tolist()
    assert got == [uniform(k, p) for k, p in zip(keys, positions)]
    assert all(0 <= u < 1 for u in got)


def _random_request(gen: torch.Generator, vocab: int):
    def pick(options):
        return options[int(torch.randint(len(options), (), generator=gen))]

    kw = dict(temperature=pick([0.0, 0.5, 1.0, 1.5]), max_tokens=100)
    if pick([0, 1]):
        kw["top_k"] = pick([1, 2, 20, vocab - 1, vocab + 5])
    if pick([0, 1]):
        kw["top_p"] = pick([0.1, 0.5, 0.9, 0.99])
    if pick([0, 1]):
        kw["min_p"] = pick([0.01, 0.1, 0.5])
    if pick([0, 1]):
        kw.update(repetition_penalty=pick([0.8, 1.2, 2.0]), frequency_penalty=pick([-1.0, 0.5]),
                  presence_penalty=pick([0.0, 1.0]), min_tokens=pick([0, 3]))
    prompt = torch.randint(vocab, (int(torch.randint(60, ())),), generator=gen).tolist()
    banned = torch.randint(vocab, (4,), generator=gen).tolist()
    return SamplingParams(**kw), prompt, banned


@needs_kernel
def test_c_and_torch_paths_agree_token_for_token():
    """Same seeds, same logits: the same tokens. Both paths compute the same thresholds
    and the same inverse CDF, so they can only differ where exp() (torch's vs libm's, an
    ulp apart) or a sum's order moves a cumulative mass across u * total or top_p: about
    1e-7 of a draw. Integer logits (many exact ties) check that ties are treated alike."""
    gen = torch.Generator().manual_seed(11)
    mismatches = total = 0
    for trial, vocab in enumerate([7, 300, 5000, 5000, 20000]):
        samplers = [make_sampler(k, vocab, seed=trial) for k in (False, True)]
        ids = [str(i) for i in range(24)]
        for i in ids:
            params, prompt, banned = _random_request(gen, vocab)
            seed = None if int(i) % 3 else int(i) * 7919
            for sampler in samplers:
                sampler.add_request(i, params, prompt, [], banned, seed)
        for step in range(5):
            if step % 2:
                logits = torch.randint(-3, 4, (len(ids), vocab), generator=gen).float()
            else:
                logits = torch.randn(len(ids), vocab, generator=gen) * 4
            torch_ids, c_ids = (s.sample(logits, ids).token_ids for s in samplers)
            mismatches += sum(a != b for a, b in zip(torch_ids, c_ids))
            total += len(ids)
    assert mismatches <= total // 200, f"{mismatches} of {total} tokens differ"


@pytest.mark.parametrize("use_kernel", PATHS)
def test_penalty_state_is_kept_incrementally(use_kernel):
    vocab = 64
    gen = torch.Generator().manual_seed(2)
    params = SamplingParams(temperature=0.0, repetition_penalty=1.5, frequency_penalty=0.7,
                            presence_penalty=0.4)
    prompt, output = [1, 2, 2, 60, 99999, -1], [5, 5]  # out-of-vocabulary ids are ignored
    sampler = make_sampler(use_kernel, vocab)
    sampler.add_request("a", params, prompt, output, [], seed=None)
    for _ in range(12):
        # Few distinct levels: repeats happen, and the penalties decide the argmax (the
        # noise breaks exact ties, which float32 and float64 could break differently).
        logits = (torch.randint(0, 4, (1, vocab), generator=gen).float() * 0.5
                  + torch.randn(1, vocab, generator=gen) * 0.01)
        expected = int(reference_probs(logits[0], params, prompt[:4], output).argmax())
        token = sampler.sample(logits, ["a"]).token_ids[0]
        assert token == expected
        output.append(token)
    state = sampler._requests["a"]
    assert sorted(state.seen().tolist()) == sorted(set(prompt[:4] + output))
    counts = Counter(output)
    n = len(counts)
    assert dict(zip(state.out_ids[:n].tolist(), state.counts[:n].tolist())) == counts
    assert torch.allclose(torch.from_numpy(state.deltas[:n]).double(), torch.tensor(
        [0.7 * counts[t] + 0.4 for t in state.out_ids[:n].tolist()], dtype=torch.float64))
    assert state.position == len(output)


@pytest.mark.parametrize("use_kernel", PATHS)
def test_repetition_penalty_from_an_empty_history(use_kernel):
    sampler = make_sampler(use_kernel, 4)
    sampler.add_request("a", SamplingParams(temperature=0, repetition_penalty=2.0), [], [], [],
                        seed=None)
    logits = torch.tensor([[1.0, 0.9, 0.2, 0.1]])  # 0; then 0.5 < 0.9: 1; then 0.5 > 0.45
    assert [sampler.sample(logits, ["a"]).token_ids[0] for _ in range(3)] == [0, 1, 0]


@pytest.mark.parametrize("use_kernel", PATHS)
def test_min_tokens_bans_until_reached(use_kernel):
    vocab = 20
    logits = torch.arange(vocab, dtype=torch.float32).unsqueeze(0)  # argmax: 19, then 18
    sampler = make_sampler(use_kernel, vocab)
    sampler.add_request("g", SamplingParams(temperature=0, min_tokens=3), [], [], [19, 18],
                        seed=None)
    sampler.add_request("s", SamplingParams(temperature=1.0, top_k=2, min_tokens=2), [], [],
                        [19], seed=3)
    got = [sampler.sample(logits.repeat(2, 1), ["g", "s"]).token_ids for _ in range(4)]
    assert [g for g, _ in got] == [17, 17, 17, 19]
    assert all(s in (17, 18) for _, s in got[:2])  # the top 2 of what is left
    assert all(s in (18, 19) for _, s in got[2:])


@pytest.mark.parametrize("use_kernel", PATHS)
def test_greedy_is_the_argmax(use_kernel):
    vocab = 1000
    logits = torch.randn(9, vocab, generator=torch.Generator().manual_seed(4))
    logits[3, 10] = logits[3, 20] = logits[3].max() + 1  # a tie: the first index
    sampler = make_sampler(use_kernel, vocab)
    ids = [str(i) for i in range(9)]
    for i in ids:  # all greedy: the one-argmax path
        sampler.add_request(i, SamplingParams(temperature=0), [], [], [], seed=None)
    assert sampler.sample(logits, ids).token_ids == logits.argmax(-1).tolist()
    sampler.add_request("3", SamplingParams(temperature=1.0), [], [], [], seed=None)
    assert sampler.sample(logits, ids).token_ids[4:] == logits[4:].argmax(-1).tolist()


@pytest.mark.parametrize("use_kernel", PATHS)
def test_logprobs_are_of_the_raw_distribution(use_kernel):
    vocab = 300
    logits = torch.randn(3, vocab, generator=torch.Generator().manual_seed(9)) * 2
    sampler = make_sampler(use_kernel, vocab)
    sampler.add_request("a", SamplingParams(temperature=0.5, top_k=5, logprobs=4,
                                            repetition_penalty=1.5), [1, 2, 3], [], [], 1)
    sampler.add_request("b", SamplingParams(logprobs=0), [], [], [], 2)
    sampler.add_request("c", SamplingParams(), [], [], [], 3)
    before = logits.clone()
    out = sampler.sample(logits, ["a", "b", "c"])
    assert torch.equal(logits, before)  # the kernel penalizes in place, then restores
    raw = torch.log_softmax(logits, dim=-1)
    assert out.logprobs[2] is None
    for row, (lps, token, num) in enumerate(zip(out.logprobs, out.token_ids, [4, 0])):
        assert token in lps and len(lps) in (num, num + 1)
        chosen = lps[token]
        assert chosen.logprob == pytest.approx(raw[row, token].item(), abs=1e-5)
        assert chosen.rank == 1 + int((raw[row] > raw[row, token]).sum())
        values, top = raw[row].topk(num)
        for rank, (value, tid) in enumerate(zip(values.tolist(), top.tolist()), start=1):
            assert lps[tid].rank == rank and lps[tid].logprob == pytest.approx(value, abs=1e-5)
    single = top_logprobs(raw[0], 7, 2)
    assert single[7].rank == 1 + int((raw[0] > raw[0, 7]).sum()) and len(single) in (2, 3)


@needs_kernel
def test_kernel_restores_penalized_logits():
    vocab = 100
    logits = torch.randn(2, vocab, generator=torch.Generator().manual_seed(1))
    sampler = make_sampler(True, vocab)
    params = SamplingParams(repetition_penalty=1.2, frequency_penalty=0.5, min_tokens=4)
    for i in "ab":
        sampler.add_request(i, params, [1, 1, 2, 3], [3, 4, 4], [3, 5], seed=None)
    before = logits.clone()
    sampler.sample(logits, ["a", "b"])
    assert torch.equal(logits, before)
