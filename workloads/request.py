"""What a workload produces: requests that know nothing about memory."""

from __future__ import annotations

from dataclasses import dataclass, field

from token_content import TokenContent, content_length


@dataclass(frozen=True, slots=True, init=False)
class Request:
    """One user request.

    ``prompt`` is token content as segments ``(content_id, length)`` (see ``token_content``): two
    requests share exactly the tokens whose segments name the same stream at the same offsets.
    ``output_content_id`` names the stream the request generates, so a later conversation turn can
    put that same stream in its prompt and hit the cached blocks of this turn's answer (sample 0's,
    when there are several). (Its constructor is written out: compiled, it runs natively, where a
    dataclass's generated one stays interpreted; one is built per request.)
    """

    request_id: int
    arrival_s: float
    prompt: TokenContent
    output_len: int
    output_content_id: int
    n: int = 1  # parallel samples (OpenAI/vLLM `n`)
    beam_width: int = 1  # beam search width (1 = no beam search)
    session_id: int | None = None  # conversation / user, when the source has one
    # Output length of each parallel sample when they differ (``n`` entries, sample 0 first, whose
    # length is ``output_len``); empty: every sample/beam generates ``output_len`` tokens.
    sample_output_lens: tuple[int, ...] = ()
    # Derived from ``prompt`` once: the engine reads it several times per request.
    prompt_len: int = field(init=False, repr=False, compare=False)

    def __init__(
        self,
        request_id: int,
        arrival_s: float,
        prompt: TokenContent,
        output_len: int,
        output_content_id: int,
        n: int = 1,
        beam_width: int = 1,
        session_id: int | None = None,
        sample_output_lens: tuple[int, ...] = (),
    ) -> None:
        # (Frozen: set through object's setter, as the dataclass's own constructor would.)
        setattr_ = object.__setattr__
        setattr_(self, "request_id", request_id)
        setattr_(self, "arrival_s", arrival_s)
        setattr_(self, "prompt", prompt)
        setattr_(self, "output_len", output_len)
        setattr_(self, "output_content_id", output_content_id)
        setattr_(self, "n", n)
        setattr_(self, "beam_width", beam_width)
        setattr_(self, "session_id", session_id)
        setattr_(self, "sample_output_lens", sample_output_lens)
        setattr_(self, "prompt_len", content_length(prompt))

    @property
    def width(self) -> int:
        """Sequences the request runs once forked: samples or beams."""
        return max(self.n, self.beam_width)

    @property
    def output_lens(self) -> tuple[int, ...]:
        """Tokens each sample/beam generates (``width`` entries, sample 0 first)."""
        return self.sample_output_lens or (self.output_len,) * self.width

    @property
    def longest_output_len(self) -> int:
        """Tokens of its longest sample: the request's decode steps."""
        return max(self.sample_output_lens) if self.sample_output_lens else self.output_len

    @property
    def final_len(self) -> int:
        """Prompt plus its longest sample: the longest sequence it runs."""
        return self.prompt_len + self.longest_output_len
