"""`sjf`: shortest predicted remaining work first: prompt tokens still to compute (less what
the prefix cache holds) plus predicted output tokens still to generate. Aging divides the
work by (1 + age / aging_s), so a long job ends up outranking newcomers. Output lengths come
from the policy's predictor (--length-predictor)."""

from __future__ import annotations

from minivllm.core.length_predictor import LengthPredictor
from minivllm.core.policies.base import SchedulingPolicy
from minivllm.core.request import Request


class ShortestJobFirstPolicy(SchedulingPolicy):
    name = "sjf"

    def __init__(self, aging_s: float = 10.0, predictor: LengthPredictor | None = None) -> None:
        super().__init__(aging_s, predictor)
        # sort_key runs for every queued request at every step: each one's prediction is
        # kept, with what it depends on (see predicted_output), until that changes.
        self._predictions: dict[Request, tuple[tuple[int, bool], float]] = {}
        self._num_finished = 0  # requests the predictor has learned from

    def predicted_output(self, request: Request) -> float:
        """The predictor's answer for the request. It changes only when the predictor learns
        from a finished request, or when the request's prompt hidden state arrives (the
        probe's input); asking again in between changes nothing (the probe refits at the
        first ask after it learned, which a finish makes a fresh ask either way)."""
        stamp = (self._num_finished, request.prompt_hidden is None)
        kept = self._predictions.get(request)
        if kept is None or kept[0] != stamp:
            kept = self._predictions[request] = (stamp, self.predictor.predict(request))
        return kept[1]

    def remaining_work(self, request: Request) -> int:
        # sort_key runs for every queued request at every step (the simulator's hot spot):
        # the request's lists and the kept prediction are read directly, and the bounds are
        # conditionals, not max() calls (the same values)
        computed, num_prompt = request.num_computed_tokens, len(request.prompt_token_ids)
        if computed < num_prompt:  # else no prompt is left: skip the probe
            cached = self.cached_tokens(request)
            computed = cached if cached > computed else computed
        kept = self._predictions.get(request)
        if kept is None or kept[0] != (self._num_finished, request.prompt_hidden is None):
            predicted = self.predicted_output(request)
        else:
            predicted = kept[1]
        output_left = predicted - len(request.output_token_ids)
        prompt_left = num_prompt - computed
        return ((prompt_left if prompt_left > 0 else 0)
                + (output_left if output_left > 1 else 1))

    def sort_key(self, request: Request, now: float) -> tuple:
        age = now - request.arrival_time  # self.age, inlined (hot, as above)
        effective = self.remaining_work(request) / (1.0 + (age if age > 0.0 else 0.0)
                                                    / self.aging_s)
        return (effective, request.arrival_time, request.request_id)

    def unranked(self, requests: list[Request], now: float) -> bool:
        return self.predictor.unasked(requests)  # the rest of sort_key only reads

    def on_finished(self, request: Request) -> None:
        super().on_finished(request)
        self._num_finished += 1

    def on_removed(self, request: Request) -> None:
        self._predictions.pop(request, None)
