"""The policy registry: the abstract methods a policy must implement, checked when it registers (not
by an ABC: a compiled build shares one ABC isinstance cache between classes, see policies/base.py)."""

from __future__ import annotations

import pytest

from policies import PoolSpec, make_policy, policy_names
from policies.base import _REGISTRY, ABSTRACT_METHODS, KVCachePolicy, register
from policies.paged import PagedPolicy
from policies.prefix import PrefixCachingPolicy


def test_the_checked_methods_are_the_abstract_ones():
    decorated = {
        name for name, value in vars(KVCachePolicy).items() if getattr(value, "__isabstractmethod__", False)
    }
    if not decorated:
        pytest.skip("the compiled build keeps no __isabstractmethod__ flags: checked with the sources")
    assert set(ABSTRACT_METHODS) == decorated


def test_a_policy_written_in_python_registers_and_one_that_misses_methods_is_refused_by_name():
    """Python subclasses of KVCachePolicy work, compiled build or not; an incomplete one is refused
    when it registers, naming what it lacks."""

    class Incomplete(KVCachePolicy):
        def admit(self, seq_id, prompt, final_len, output_content_id, namespace=0):
            return 0

    def stub(self, *args, **kwargs):
        return 0

    complete = type("Complete", (Incomplete,), {name: stub for name in ABSTRACT_METHODS if name != "admit"})
    with pytest.raises(
        TypeError, match=r"Incomplete \('incomplete-test'\) does not implement _has_sequence, "
    ):
        register("incomplete-test", Incomplete)
    assert "incomplete-test" not in policy_names()
    register("complete-test", complete)
    try:
        policy = make_policy("complete-test", PoolSpec(64, 4, 16))
        assert isinstance(policy, KVCachePolicy) and policy.name == "complete-test"
        assert policy.admit(0, ((1, 4),), 8, output_content_id=1) == 0
    finally:
        _REGISTRY.pop("complete-test", None)


def test_isinstance_answers_stay_per_class():
    """A negative isinstance answer for one policy class does not leak into another's (compiled ABCs
    share one cache: a prefix policy once asked for a contiguous one then failed ``isinstance(_,
    PagedPolicy)``)."""
    from policies.contiguous import ContiguousPolicy

    prefix = make_policy("prefix", PoolSpec(64, 4, 16))
    assert not isinstance(prefix, ContiguousPolicy)
    assert isinstance(prefix, PagedPolicy) and isinstance(prefix, PrefixCachingPolicy)
    assert isinstance(prefix, KVCachePolicy)


def test_policies_listing_describes_every_policy_under_either_build() -> None:
    # (the compiled build drops module docstrings: the listing reads them from the sources)
    from policies.base import policy_names
    from sim.listing import policies_table

    blocks = policies_table().split("\n\n")
    for name in policy_names():
        block = next(block for block in blocks if block.startswith(f"{name}\n"))
        summary = block.split("\n")[1].strip()
        assert len(summary) > 20, (name, summary)


def test_a_name_registered_twice_is_refused_and_the_first_stays():
    with pytest.raises(ValueError, match=r"^policy name 'paged' registered twice$"):
        register("paged", PrefixCachingPolicy)
    assert make_policy("paged", PoolSpec(64, 4, 16)).__class__ is PagedPolicy
