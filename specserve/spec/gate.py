"""``speculative_config.disable_when_slower``: draft only while speculation measures faster than plain decoding.

Whether a speculative step pays depends on the text (acceptance with the demo drafter: ~1.6 tokens a step on chat
prompts, ~2.2-3.6 on gsm8k answers) and on the machine (what a K+1-token verify + the drafter cost against a
one-token step: ~1.3x on an 8B target on the GPU, ~1.7-2.1x on SmolLM2 there, ~1.2x on 2 CPU cores at K=3). The
engine measures both online and drafts for the next step only while

    mean tokens a request gets from a speculative step  >=  (1 - margin) x (speculative step time) / (plain step time)

at the current batch size. Step times are completion-to-completion intervals of decode steps of one kind at one
batch size (what the caller sees, pipelining included); acceptance averages the recent speculative steps of the
requests that drafted away from their end (drafts cut short near max_tokens say nothing about the text). While drafting is off
the drafter still reads every step's target features (its context stays whole, ``ModelRunner.drafting_on``; DFlash
does it in a graph after the target's, so those steps pipeline like plain decoding), and the gate probes
speculation again after ``probe_min`` plain steps, doubling the wait after each probe that loses (up to
``probe_max``; a prefill, i.e. a new request, halves it). Drafting goes off only when speculation loses by more
than ``margin``: each switch costs a drained pipeline and a synchronous step.

Opt-in (vLLM always drafts), and not the demo's default: on SmolLM2 with the demo drafter it measured mixed
(benchmarks/README.md, session 27). Lossless either way: drafts are only ever verified by the target.
"""

from __future__ import annotations

# a decode step's kind: it verified drafts / it neither verified nor proposed any / it proposed, verified none
SPEC, PLAIN, TRANSITION = "spec", "plain", "transition"


class SpeculationGate:
    def __init__(
        self,
        alpha: float = 0.05,
        margin: float = 0.1,
        warmup: int = 4,
        measure: int = 3,
        probe_len: int = 8,
        probe_min: int = 16,
        probe_max: int = 256,
    ) -> None:
        self.alpha = alpha
        # drafting goes off only when speculation measures clearly slower (acceptance < (1 - margin) x the time
        # ratio): near break-even each switch costs more (a drained pipeline, a synchronous step) than it saves
        self.margin = margin
        self.warmup = warmup  # speculative steps at a batch size before its plain step time is measured
        self.measure = measure  # plain steps run to measure (the first one's interval is a transition)
        self.probe_len = probe_len  # speculative steps a probe runs (fresh acceptance)
        self.probe_min, self.probe_max = probe_min, probe_max
        self.probe_every = probe_min
        self.state = SPEC
        self.remaining = 0  # steps of the current state still forced (measuring / probing / waiting)
        # averages: the plain mean of the first 1/alpha samples, then exponential (alpha)
        self.acc: float | None = None  # tokens per request per speculative step (requests far from their end)
        self.acc_n = 0
        self.t: dict[tuple[str, int], float] = {}  # seconds per step by (kind, batch size)
        self.t_n: dict[tuple[str, int], int] = {}
        self.spec_steps: dict[int, int] = {}
        self._last: tuple[str, int, float] | None = None  # (kind, batch, time) of the last step recorded
        self.num_plain_steps = 0  # steps run with drafting off by the gate (metrics / benchmarks)
        self.num_probes = 0

    # ------------------------------------------------------------------ queries (pure)
    def drafting_on(self, batch_size: int) -> bool:
        """Whether a step at this batch size proposes drafts for the next one."""
        return self.state == SPEC

    def ratio(self, b: int) -> float | None:
        """Speculative step time / plain step time at batch size b, once both were measured."""
        ts, tp = self.t.get((SPEC, b)), self.t.get((PLAIN, b))
        return ts / tp if ts is not None and tp else None

    # ------------------------------------------------------------------ updates
    def _avg(self, old: float | None, n: int, x: float) -> float:
        return x if old is None else old + max(self.alpha, 1.0 / n) * (x - old)

    def record(self, kind: str | None, b: int, now: float, tokens_per_request: float | None = None) -> None:
        """A step finished at ``now``. ``kind``: SPEC (it verified drafts; ``tokens_per_request`` = the mean number
        of tokens each request that drafted more than 2(K+1) tokens before its max_tokens got, None if none did:
        drafts cut short near the end say nothing about the text), PLAIN (a decode step that neither verified nor
        proposed drafts), TRANSITION (a decode step that proposed drafts but verified none) or None (anything with a
        prefill chunk). Updates the estimates, then the state."""
        last, self._last = self._last, ((kind, b, now) if kind is not None else None)
        if kind is None:
            # a prefill: a new request's text may accept differently: the back-off halves, the wait with it
            self.probe_every = max(self.probe_min, self.probe_every // 2)
            if self.state == PLAIN:
                self.remaining = min(self.remaining, self.probe_every // 2)
            return
        if last is not None and last[0] == kind and last[1] == b and kind in (SPEC, PLAIN):
            key = (kind, b)
            self.t_n[key] = self.t_n.get(key, 0) + 1
            self.t[key] = self._avg(self.t.get(key), self.t_n[key], now - last[2])
        if kind == SPEC:
            if tokens_per_request is not None:
                self.acc_n += 1
                self.acc = self._avg(self.acc, self.acc_n, tokens_per_request)
            self.spec_steps[b] = self.spec_steps.get(b, 0) + 1
        elif kind == PLAIN and self.state == PLAIN:
            self.num_plain_steps += 1
        if kind == self.state and self.remaining > 0:
            self.remaining -= 1
            if self.remaining > 0:
                return
        elif kind != self.state:
            return
        self._decide(b)

    def _decide(self, b: int) -> None:
        r = self.ratio(b)
        if self.state == SPEC:
            if (PLAIN, b) not in self.t:
                if self.spec_steps.get(b, 0) >= self.warmup:
                    self.state, self.remaining = PLAIN, self.measure  # measure plain steps at this batch size
            elif r is not None and self.acc is not None and self.acc < (1 - self.margin) * r:
                self.state, self.remaining = PLAIN, self.probe_every
                self.probe_every = min(2 * self.probe_every, self.probe_max)
            elif self.remaining == 0 and r is not None and self.acc is not None:
                self.probe_every = self.probe_min  # speculation wins: a later loss waits the shortest time
        else:
            if self.remaining == 0:
                # measured (or waited): probe speculation with a fresh acceptance estimate
                self.state, self.remaining, self.acc, self.acc_n = SPEC, self.probe_len, None, 0
                self.num_probes += 1
