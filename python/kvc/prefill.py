"""The server's own prefill time, as a connector prices recomputation.

A connector that decides between loading KV and letting the server
recompute it must price the recompute at the server's speed, not at kvc's:
a load priced against a slower prefill than the server's would be chosen
where recomputing is faster. :class:`PrefillClock` learns the server's
prefill from the steps it times (seconds = a + b * tokens, a Theil-Sen
fit through the fastest of the recent steps of each size that only
prefilled, those beside which none of kvc's saves ran when they are
enough), and :func:`scaled_target`
rescales a target machine's compute so that kvc's planner prices the
server's forward pass (which a layer-wise load runs beside) at that speed.
:class:`LoadClock` holds what the planner does not see of the server's
loads (its own copies, its threads' contention with the forward pass):
the ratio of the steps that loaded to what was predicted of them.
:func:`mean_first_token` runs a queue of requests through the server's
token-budgeted steps, so that a load is weighed by what it does to every
request waiting beside it, not to its own request alone.
"""

from __future__ import annotations

import copy
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["LoadClock", "PrefillClock", "mean_first_token", "scaled_target"]


class PrefillClock:
    """Seconds the server takes to prefill ``n`` tokens, fit to the steps
    it was seen to take.

    Args:
        samples: steps kept (the most recent).
        min_samples: step sizes needed before :meth:`seconds` answers.
    """

    def __init__(self, samples: int = 64, min_samples: int = 4) -> None:
        self._steps: deque[tuple[int, float, bool]] = deque(maxlen=samples)
        self._min_samples = min_samples
        self._fit: tuple[float, float] | None = None

    def observe(self, tokens: int, seconds: float, clean: bool = True) -> None:
        """One step that prefilled ``tokens`` tokens in ``seconds``;
        ``clean`` unless the connector's own work (a save's copies and
        writes) ran beside it, which the fit uses only while the clean
        steps are too few to fit."""
        if tokens <= 0 or seconds <= 0:
            return
        self._steps.append((tokens, seconds, clean))
        self._fit = None

    @property
    def ready(self) -> bool:
        """Whether enough steps of more than one size were seen."""
        return self._coefficients() is not None

    @property
    def steps(self) -> int:
        return len(self._steps)

    @property
    def samples(self) -> list[tuple[int, float, bool]]:
        """The steps kept: (tokens, seconds, clean) each, oldest first."""
        return list(self._steps)

    def seconds(self, tokens: int) -> float | None:
        """The predicted seconds of a prefill of ``tokens`` tokens (0 for
        none); None until :attr:`ready`."""
        if tokens <= 0:
            return 0.0
        fit = self._coefficients()
        if fit is None:
            return None
        intercept, per_token = fit
        return intercept + per_token * tokens

    @property
    def fit(self) -> tuple[float, float] | None:
        """(a, b) of seconds = a + b * tokens; None until :attr:`ready`."""
        return self._coefficients()

    def typical_tokens(self) -> int:
        """The mean size of the steps seen (0 before any)."""
        if not self._steps:
            return 0
        return round(sum(t for t, _, _ in self._steps) / len(self._steps))

    def _coefficients(self) -> tuple[float, float] | None:
        if self._fit is None:
            clean = [(t, s) for t, s, ok in self._steps if ok]
            self._fit = _theil_sen(_fastest(clean), self._min_samples) or \
                _theil_sen(_fastest([(t, s) for t, s, _ in self._steps]),
                           self._min_samples)
        return self._fit


def _fastest(steps: list[tuple[int, float]]) -> list[tuple[int, float]]:
    """Per size, the fastest step: the first step of a size pays one-time
    costs (a CPU build picks and JIT-compiles its kernels per shape) and a
    slower repeat was slowed by something else, so the engine's speed at a
    size is the fastest it was seen to go (which errs towards recomputing,
    the safe side)."""
    best: dict[int, float] = {}
    for tokens, seconds in steps:
        best[tokens] = min(seconds, best.get(tokens, seconds))
    return sorted(best.items())


def _theil_sen(steps: list[tuple[int, float]], min_samples: int
               ) -> tuple[float, float] | None:
    """(a, b) of seconds = a + b * tokens through ``steps``: the median of
    the slopes between steps of different sizes, so that a step the host
    stalled in (a page fault, another process) does not tilt the line as it
    would a least-squares fit; None for fewer than ``min_samples`` steps,
    one size only, or a slope that is not positive (noise larger than the
    signal)."""
    if len(steps) < min_samples:
        return None
    slopes = [(s2 - s1) / (t2 - t1)
              for i, (t1, s1) in enumerate(steps)
              for t2, s2 in steps[i + 1:] if t2 != t1]
    if not slopes:
        return None
    per_token = _median(slopes)
    if per_token <= 0:
        return None
    # A step's fixed cost is never negative.
    intercept = max(0.0, _median([s - per_token * t for t, s in steps]))
    return intercept, per_token


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[middle]
    return (ordered[middle - 1] + ordered[middle]) / 2


class LoadClock:
    """How long the server's steps that load took against their predicted
    first token: the median ratio over the recent ones, 1 until
    ``min_samples`` were seen.

    Args:
        samples: steps kept (the most recent).
        min_samples: steps needed before the ratio moves from 1.
    """

    def __init__(self, samples: int = 32, min_samples: int = 1) -> None:
        self._ratios: deque[float] = deque(maxlen=samples)
        self._min_samples = min_samples

    def observe(self, predicted: float, seconds: float) -> None:
        """A step whose loads were predicted at ``predicted`` seconds took
        ``seconds``."""
        if predicted > 0 and seconds > 0:
            self._ratios.append(seconds / predicted)

    @property
    def ratio(self) -> float:
        """Measured over predicted seconds of a step that loads."""
        if len(self._ratios) < self._min_samples:
            return 1.0
        return _median(list(self._ratios))

    @property
    def steps(self) -> int:
        return len(self._ratios)


def mean_first_token(requests: Sequence[tuple[int, float]], budget: int,
                     prefill: Callable[[int], float]) -> float:
    """The mean seconds from now to the first token of ``requests`` as a
    vLLM-like scheduler runs them: in order, each step taking requests
    until ``budget`` tokens are scheduled (a request that does not fit is
    split and finishes in a later step, first in it), a request's first
    token at the end of the step that computes its last prompt token.

    A request is (tokens, load seconds): the tokens it computes (at least
    one), and 0 for a request the server prefills, or the seconds its
    synchronous load adds to the step it joins. A step takes the sum of its
    loads, then ``prefill`` of the tokens its prefilling requests compute
    (a loading request's own tokens are in its load's seconds): loads and
    prefills of one step ran one after the other in vLLM's CPU engine
    (docs/results.md), and the loads of a step all hold up its end.
    """
    if not requests:
        return 0.0
    budget = max(1, budget)
    total = 0.0
    clock = 0.0
    following = 0
    carried: tuple[int, int] | None = None  # (request, tokens left)
    while following < len(requests) or carried is not None:
        room = budget
        loads = 0.0
        prefilled = 0
        finished = 0
        while room > 0 and (carried is not None or following < len(requests)):
            if carried is not None:
                index, left = carried
                carried = None
            else:
                index = following
                following += 1
                left = max(1, requests[index][0])
                loads += requests[index][1]
            taken = min(left, room)
            room -= taken
            if requests[index][1] <= 0:
                prefilled += taken
            if taken < left:
                carried = (index, left - taken)
            else:
                finished += 1
        clock += loads + (prefill(prefilled) if prefilled else 0.0)
        total += clock * finished
    return total / len(requests)


def scaled_target(target: dict[str, Any], factor: float) -> dict[str, Any]:
    """``target`` with its compute ``factor`` times as fast (its FLOP rate
    and memory bandwidth both), named as measured."""
    if factor <= 0:
        raise ValueError("factor must be positive")
    scaled = copy.deepcopy(target)
    compute = scaled.setdefault("compute", {})
    for key in ("dense_tflops", "mem_gbs"):
        if key in compute:
            compute[key] = float(compute[key]) * factor
    scaled["name"] = f"{target.get('name', 'target')}+server-prefill"
    scaled["description"] = (f"{target.get('name', 'target')} with its compute "
                             f"scaled by {factor:.4g} to the server's measured "
                             "prefill")
    return scaled
