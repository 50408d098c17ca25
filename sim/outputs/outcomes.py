"""What happened to the requests a run could not serve: counts and the most common reasons.

Reasons carry the request's own numbers ("prompt 500 + output 9,000 = 9,500 tokens ..."), so they are
grouped by their wording with the numbers masked, and each group is shown with one full example.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import pandas as pd

UNSERVED = ("rejected", "failed_oom")
"""Outcomes of requests the run did not serve (``unfinished`` ones were cut off by ``until_s``)."""

_NUMBER = re.compile(r"\d[\d,.]*")


@dataclass(frozen=True)
class ReasonGroup:
    outcome: str
    count: int
    example: str
    """The full reason of the first request in the group."""


@dataclass(frozen=True)
class Outcomes:
    """Counts of a variant's requests by outcome, and the commonest reasons of the unserved ones."""

    total: int
    rejected: int
    failed: int
    groups: list[ReasonGroup] = field(default_factory=list)

    @property
    def unserved(self) -> int:
        return self.rejected + self.failed


def summarize_outcomes(requests: pd.DataFrame, top: int = 3) -> Outcomes:
    """``requests`` needs the ``outcome`` and ``reason`` columns of a requests table."""
    unserved = requests[requests["outcome"].isin(UNSERVED)]
    groups: list[ReasonGroup] = []
    if len(unserved):
        keys = (
            unserved["outcome"] + "\0" + unserved["reason"].astype(str).str.replace(_NUMBER, "#", regex=True)
        )
        counts = keys.value_counts(sort=True)
        for key, count in counts.head(top).items():
            first = unserved[keys == key].iloc[0]
            groups.append(ReasonGroup(str(first["outcome"]), int(count), str(first["reason"])))
    return Outcomes(
        total=len(requests),
        rejected=int((requests["outcome"] == "rejected").sum()),
        failed=int((requests["outcome"] == "failed_oom").sum()),
        groups=groups,
    )


def format_outcomes(by_variant: dict[str, Outcomes]) -> str:
    """Lines for the end of a run; empty when every variant served every request. Variants with the
    same counts and reasons (the usual case: rejections depend on lengths, not on the policy) share
    one block."""
    blocks: dict[tuple, list[str]] = {}
    for name, outcomes in by_variant.items():
        if outcomes.unserved:
            key = (outcomes.total, outcomes.rejected, outcomes.failed, tuple(outcomes.groups))
            blocks.setdefault(key, []).append(name)
    lines = []
    for (total, rejected, failed, groups), names in blocks.items():
        who = "every variant" if len(names) == len(by_variant) > 1 else ", ".join(names)
        counts = [f"{rejected:,} rejected"] if rejected else []
        counts += [f"{failed:,} failed (KV cache out of memory, on_oom: fail)"] if failed else []
        nothing = " - nothing was served" if rejected + failed == total else ""
        lines.append(
            f"kvsim: [{who}] {' and '.join(counts)} of {total:,} requests{nothing}; commonest reasons:"
        )
        for group in groups:
            lines.append(
                f"  {group.count:>8,}  {group.outcome}: {group.example}"
                + (" (and similar)" if group.count > 1 else "")
            )
    return "\n".join(lines)
