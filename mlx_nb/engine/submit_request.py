"""One request, as the engine takes it: typed, with no wire format's names.

The routes (mlx_nb.api), the Client and the magics each read their own inputs (OpenAI's, Anthropic's,
a notebook's) and build a `SubmitRequest`; `Engine.submit_request` validates and queues it. A
constraint arrives as the engine's `Constraint` (the wire's `response_format`, `guided_regex`, ...
are read in `mlx_nb.api.constraint_fields`), images inside the messages, a thinking model's switches
as template keywords and a budget. `Engine.submit(**fields)` is the same thing as keywords.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Callable, Optional

from mlx_nb.engine.sampling.constrained import Constraint
from mlx_nb.engine.types import SamplingParams


@dataclass
class SubmitRequest:
    """A chat (`messages`) or a completion (`prompt`, with a `suffix` for fill-in-the-middle), how
    to sample it, what to hold it to, and who asked (`source`, for the batch timeline).
    `sampling.max_tokens` None means the rest of the context."""

    messages: Optional[list] = None
    prompt: Optional[str] = None
    sampling: SamplingParams = field(default_factory=SamplingParams)
    # what the reply is held to
    tools: Optional[list] = None
    constraint: Optional[Constraint] = None
    logits_processors: Optional[list] = None
    sampler: Optional[Callable] = None
    # the chat template and a thinking model's reasoning
    chat_template_kwargs: Optional[dict] = None
    reasoning_budget: Optional[int] = None
    split_reasoning: bool = True
    suffix: Optional[str] = None
    request_id: Optional[str] = None
    source: Optional[str] = None
    adapter: Optional[str] = None  # a LoRA adapter loaded on the engine (Engine.load_adapter), for this row
    # a dataset job's id: the row runs in the background lane, in the slots interactive requests leave
    # (engine/scheduling/background.py); None: an interactive request, admitted at once
    job: Optional[str] = None

    @classmethod
    def of(cls, **given: Any) -> "SubmitRequest":
        """From flat keywords (`temperature=0.7` among them, as `Engine.submit` takes them), refusing
        a name it does not take with one line saying what to send."""
        own = {f.name for f in fields(cls)} - {"sampling"}
        sampled = {f.name for f in fields(SamplingParams)}
        for name in given:
            if name not in own | sampled:
                hint = (": pass constraint=constraint_of(response_format=...) from mlx_nb.api.constraint_fields"
                        if name == "response_format" else f" (it takes {', '.join(sorted(own | sampled))})")
                raise TypeError(f"Engine.submit() got an unexpected keyword argument {name!r}{hint}")
        sampling = SamplingParams(**{k: v for k, v in given.items() if k in sampled})
        return cls(sampling=sampling, **{k: v for k, v in given.items() if k in own})

    def sampling_for(self, context: int) -> SamplingParams:
        """A copy of the sampling parameters in their types, a budget of None being the rest of a
        `context`-token window (the engine then clamps it to what fits after the prompt)."""
        p = self.sampling
        stop = p.stop
        return SamplingParams(
            max_tokens=context if p.max_tokens is None else p.max_tokens,
            temperature=float(p.temperature),
            top_p=float(p.top_p),
            top_k=p.top_k,
            min_p=float(p.min_p),
            repetition_penalty=float(p.repetition_penalty),
            presence_penalty=float(p.presence_penalty),
            frequency_penalty=float(p.frequency_penalty),
            logit_bias=dict(p.logit_bias or {}),
            stop=[stop] if isinstance(stop, str) else list(stop or []),
            seed=p.seed,
            logprobs=int(p.logprobs or 0),
        )
