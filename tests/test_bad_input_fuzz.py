"""Slips in the shipped files against the up-front checks (``tests/fuzz_bad_input.py``): a short run
of fixed seeds, and the oracle itself. ``make fuzz-bad-input`` runs thousands more."""

from __future__ import annotations

import random

import yaml

from tests.fuzz_bad_input import SHIPPED, Slip, _absolute_paths, check_case, mutate


def test_slips_in_the_shipped_files_are_accepted_or_refused_with_a_message(tmp_path):
    """300 slips, one or two each: every one accepted or refused with a message naming the file or the
    key (none raises anything else). Most are refused."""
    documents = {path: _absolute_paths(yaml.safe_load(path.read_text()), path.parent) for path in SHIPPED}
    outcomes = []
    for index in range(300):
        rng = random.Random(f"suite-{index}")
        source = rng.choice(SHIPPED)
        document, slip = mutate(documents[source], rng)
        outcome, detail = check_case(source, document, slip, tmp_path)
        assert outcome != "bug", (source.name, slip.text, detail)
        outcomes.append(outcome)
    assert outcomes.count("refused") >= 200


def test_the_oracle_reports_a_traceback_and_a_message_that_names_nothing(tmp_path, monkeypatch):
    """A refusal must name the file or a key of the slip; anything raised but the CLI's input errors
    (a KeyError from a plan's search key running through a word, before its fix) is a bug."""
    import tests.fuzz_bad_input as fuzz
    from sim.config import ConfigError

    source = next(path for path in SHIPPED if path.name == "quickstart.yaml")
    document = yaml.safe_load(source.read_text())
    slip = Slip("engine.block_size = 'sixteen'", ["engine", "block_size"])
    document["engine"]["block_size"] = "sixteen"
    outcome, detail = check_case(source, document, slip, tmp_path)
    assert outcome == "refused" and "quickstart.yaml: invalid experiment config" in detail

    def raises(error):
        def check(path):
            raise error

        return check

    monkeypatch.setattr(fuzz, "check_file", raises(KeyError("workload.arrival holds 'abc'")))
    outcome, detail = check_case(source, document, slip, tmp_path)
    assert outcome == "bug" and detail.startswith("KeyError at test_bad_input_fuzz.py:")
    monkeypatch.setattr(fuzz, "check_file", raises(ConfigError("something is wrong")))
    assert check_case(source, document, slip, tmp_path) == (
        "bug",
        "refused naming neither the file nor the key: something is wrong",
    )
    assert Slip("x", ["workload", 0, "prompt_len"]).names == ["workload", "prompt_len"]
