"""What a workload produces: requests that know nothing about memory."""

from __future__ import annotations

from dataclasses import dataclass

from policies.base import TokenContent, content_length


@dataclass(frozen=True, slots=True)
class Request:
    """One user request.

    ``prompt`` is token content as segments ``(content_id, length)`` (see ``policies.base``): two
    requests share exactly the tokens whose segments name the same stream at the same offsets.
    ``output_content_id`` names the stream the request generates, so a later conversation turn can
    put that same stream in its prompt and hit the cached blocks of this turn's answer.
    """

    request_id: int
    arrival_s: float
    prompt: TokenContent
    output_len: int
    output_content_id: int
    n: int = 1  # parallel samples (OpenAI/vLLM `n`)
    beam_width: int = 1  # beam search width (1 = no beam search)
    session_id: int | None = None  # conversation / user, when the source has one

    @property
    def prompt_len(self) -> int:
        return content_length(self.prompt)

    @property
    def final_len(self) -> int:
        return self.prompt_len + self.output_len
