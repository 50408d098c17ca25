"""Bad input is a one-line error naming the file, key and value, before any simulation runs; runs that
could not serve requests say so (and fail under --strict)."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
import yaml

from sim.cli import main, progress_enabled
from sim.config import ConfigError, load_experiment
from sim.runner import prepare_experiment
from sim.storage import MARKER

ROOT = Path(__file__).resolve().parents[1]

SMALL = {
    "name": "small",
    "seed": 1,
    "model": "Llama-3.1-8B",
    "gpu": "A100-80GB",
    "engine": {"max_model_len": 2048},
    "workload": {
        "num_requests": 12,
        "arrival": {"kind": "poisson", "rate_per_s": 5},
        "prompt_len": 500,
        "output_len": 100,
    },
    "variants": [
        {"name": "contiguous-max", "policy": "contiguous", "options": {"reservation": "max"}},
        {"name": "paged", "policy": "paged"},
    ],
    "output": {"figures": False},
}


def config_file(tmp_path: Path, changes: dict | None = None, **top) -> Path:
    data = copy.deepcopy(SMALL)
    for key, value in (changes or {}).items():
        node = data
        *parents, last = key.split(".")
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        if isinstance(node, list):
            node[int(last)] = value
        else:
            node[last] = value
    data.update(top)
    path = tmp_path / "experiment.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def run(tmp_path: Path, path: Path, *extra: str) -> tuple[int, Path]:
    out = tmp_path / "out"
    return main(["run", str(path), "-q", "-o", str(out), *extra]), out


# ------------------------------------------------------------------------------------------------
# Names become folders
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("", "not a valid variant name"),
        ("../escape", "not a valid variant name"),
        ("/abs", "not a valid variant name"),
        (".hidden", "not a valid variant name"),
        ("figures", "reserved variant name"),
        ("Summary.CSV", "reserved variant name"),
    ],
)
def test_unsafe_variant_names_are_refused_naming_file_key_and_value(tmp_path, name, why):
    path = config_file(tmp_path, {"variants.1.name": name})
    with pytest.raises(ConfigError) as error:
        load_experiment(path)
    message = str(error.value)
    assert str(path) in message and f"variants.1.name: {why}" in message and f"(got {name!r})" in message


def test_duplicate_variant_names_ignoring_case_are_refused(tmp_path):
    path = config_file(tmp_path, {"variants.1.name": "Contiguous-MAX"})
    with pytest.raises(ConfigError, match=r"variants\.1\.name 'Contiguous-MAX' repeats variants\.0\.name"):
        load_experiment(path)


@pytest.mark.parametrize("name", ["..", ".", "a/b", ""])
def test_unsafe_experiment_names_are_refused(tmp_path, name):
    with pytest.raises(ConfigError, match=r"  name: not a valid experiment name"):
        load_experiment(config_file(tmp_path, name=name))


def test_negative_seed_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match=r"  seed: Input should be greater than or equal to 0 \(got -1\)"):
        load_experiment(config_file(tmp_path, seed=-1))


# ------------------------------------------------------------------------------------------------
# --set, encodings
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("variants.5.policy=paged", "variants has 2 entries (indexes 0 to 1), so there is no entry 5"),
        ("variants.x.policy=paged", "variants is a list; 'x' must be an index"),
        ("engine.block_size=[1", "the value '[1' is not valid YAML"),
        ("seed.x=1", "seed is 1, not a mapping or list"),
        ("engine..block_size=1", "expected KEY.PATH=VALUE"),
    ],
)
def test_bad_set_overrides_are_one_line_errors(tmp_path, capsys, override, message):
    code, out = run(tmp_path, config_file(tmp_path), "--set", override)
    assert code == 2
    error = capsys.readouterr().err
    assert message in error and "Traceback" not in error
    assert not out.exists()


def test_a_non_utf8_config_is_named_in_run_and_trace_stats(tmp_path, capsys):
    path = tmp_path / "latin1.yaml"
    path.write_bytes("name: caf\xe9\n".encode("latin-1"))
    assert main(["run", str(path), "-q", "-o", str(tmp_path / "out")]) == 2
    assert f"{path}: not UTF-8 text (byte 0xe9 at offset 9)" in capsys.readouterr().err
    assert main(["trace-stats", str(path)]) == 2
    assert f"{path}: not UTF-8 text (byte 0xe9 at offset 9)" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------
# Every variant checked before the first runs
# ------------------------------------------------------------------------------------------------


def test_a_later_variants_bad_option_and_engine_override_fail_before_anything_runs(tmp_path, capsys):
    path = config_file(
        tmp_path,
        {"variants.1.options": {"reservation": "max"}, "variants.0.engine": {"max_num_seqs": 8}},
    )
    code, out = run(tmp_path, path)
    assert code == 2
    captured = capsys.readouterr()
    assert "variants.1 (paged): variants.1.options: unknown option(s) 'reservation' for policy 'paged'" in (
        captured.err
    )
    assert "kvsim run" not in captured.out and not out.exists()


def test_a_radix_page_size_the_pool_cannot_be_sized_with_names_its_variant_and_key(tmp_path, capsys):
    # (The pool's slots are counted in pages before the policy is built: the error once escaped with
    # neither the file nor the key, and stopped at the first variant.)
    path = config_file(
        tmp_path,
        {
            "variants.0": {"name": "zero", "policy": "radix", "options": {"page_size": 0}},
            "variants.1": {"name": "text", "policy": "radix", "options": {"page_size": "x"}},
        },
    )
    code, out = run(tmp_path, path)
    assert code == 2 and not out.exists()
    assert capsys.readouterr().err.splitlines()[1:3] == [
        "  variants.0 (zero): variants.0.options: radix: page_size must be a positive integer (tokens per "
        "page), got 0",
        "  variants.1 (text): variants.1.options: radix: page_size must be a positive integer (tokens per "
        "page), got 'x'",
    ]


def test_a_bad_engine_override_value_names_its_key_path(tmp_path):
    path = config_file(tmp_path, {"variants.1.engine": {"block_size": -16}})
    with pytest.raises(ConfigError, match=r"variants\.1\.engine\.block_size: Input should be greater than 0"):
        load_experiment(path)


def prepare(path: Path):
    return prepare_experiment(load_experiment(path), path)


def test_contiguous_max_reservation_larger_than_the_largest_region_is_refused_with_numbers(tmp_path):
    # 400 blocks x 16 = 6,400 slots; max_model_len 5,000 fits first-fit, but buddy rounds it to 8,192
    # and the pool's largest buddy chunk is 4,096.
    engine = {"max_model_len": 5000, "num_gpu_blocks_override": 400}
    first_fit = config_file(tmp_path, {"engine": engine})
    assert len(prepare(first_fit).variants) == 2
    buddy = config_file(
        tmp_path,
        {"engine": engine, "variants.0.options": {"reservation": "max", "placement": "buddy"}},
    )
    with pytest.raises(ConfigError) as error:
        prepare(buddy)
    assert (
        "variants.0 (contiguous-max): contiguous reservation 'max' reserves max_model_len = 5,000 slots per "
        "request (rounded up to 8,192 by buddy placement), but its largest buddy chunk is 4,096 slots"
    ) in str(error.value)
    assert "nothing was simulated" in str(error.value)


def test_a_pool_smaller_than_max_model_len_is_refused_as_vllm_does(tmp_path):
    path = config_file(tmp_path, {"engine": {"max_model_len": 8192, "num_gpu_blocks_override": 300}})
    with pytest.raises(ConfigError) as error:
        prepare(path)
    assert (
        "every variant: max_model_len (8,192 tokens) is larger than the KV cache holds "
        "(300 blocks x 16 = 4,800 tokens)"
    ) in str(error.value)
    assert "Lower engine.max_model_len to at most 4,800" in str(error.value)


def test_more_blocks_than_kvsim_builds_are_refused_naming_the_key(tmp_path):
    path = config_file(tmp_path, {"engine": {"max_model_len": 2048, "num_gpu_blocks_override": 2**63}})
    with pytest.raises(ConfigError) as error:
        prepare(path)
    assert (
        "every variant: engine.num_gpu_blocks_override: 9,223,372,036,854,775,808 blocks are more than "
        "kvsim builds a pool of (67,108,864 blocks;"
    ) in str(error.value)


def test_max_model_len_beyond_the_models_context_needs_the_override_key(tmp_path):
    path = config_file(tmp_path, {"model": "Llama-2-7B", "engine": {"max_model_len": 8192}})
    with pytest.raises(
        ConfigError, match=r"engine\.max_model_len: 8,192 is beyond Llama-2-7B's context length"
    ):
        prepare(path)
    allowed = config_file(
        tmp_path,
        {"model": "Llama-2-7B", "engine": {"max_model_len": 8192, "allow_long_max_model_len": True}},
    )
    assert any("accepted (allow_long_max_model_len: true)" in note for note in prepare(allowed).warnings)


def test_block_size_checks_as_vllm(tmp_path):
    too_big = config_file(tmp_path, {"engine": {"max_model_len": 2048, "block_size": 4096}})
    with pytest.raises(
        ConfigError, match=r"engine\.block_size: 4,096 is larger than max_model_len \(2,048\)"
    ):
        prepare(too_big)
    odd = config_file(tmp_path, {"variants.1.engine": {"block_size": 24}})
    assert prepare(odd).warnings == [
        "variants.1 (paged): variants.1.engine.block_size: 24 is not a block size vLLM accepts "
        "(1, 8, 16, 32, 64, 128, 256); simulated as given"
    ]


def test_chunked_prefill_off_needs_a_token_budget_of_max_model_len(tmp_path):
    path = config_file(
        tmp_path,
        {"engine": {"max_model_len": 2048, "enable_chunked_prefill": False, "max_num_batched_tokens": 1024}},
    )
    with pytest.raises(ConfigError) as error:
        prepare(path)
    assert "engine.max_num_batched_tokens: 1,024 is smaller than max_model_len (2,048)" in str(error.value)


def test_model_and_gpu_errors_name_the_file_and_key(tmp_path):
    with pytest.raises(ConfigError, match=r"experiment\.yaml: gpu: unknown GPU 'H800'"):
        prepare(config_file(tmp_path, gpu="H800"))
    with pytest.raises(
        ConfigError, match=r"experiment\.yaml: model: model config 'nope\.json': no such file"
    ):
        prepare(config_file(tmp_path, model="nope.json"))


# ------------------------------------------------------------------------------------------------
# Rejections at the end of a run, --strict
# ------------------------------------------------------------------------------------------------


def test_rejections_are_reported_with_counts_and_both_lengths(tmp_path, capsys):
    # 500 + 100 = 600 tokens > max_model_len 550: every request is rejected, in both variants.
    path = config_file(tmp_path, {"engine": {"max_model_len": 550}})
    code, out = run(tmp_path, path)
    assert code == 0
    error = capsys.readouterr().err
    assert (
        "kvsim: [every variant] 12 rejected of 12 requests - nothing was served; commonest reasons:" in error
    )
    assert "12  rejected: prompt 500 + output 100 = 600 tokens exceeds max_model_len=550" in error
    assert (out / "capacity.txt").read_text().startswith("[contiguous-max, paged]\nGPU KV cache size")


def test_a_run_that_served_nothing_still_draws_every_figure_saying_so(tmp_path):
    from sim.figures import _nothing_ran_text, pool_labels
    from sim.results import load_results

    path = config_file(tmp_path, {"engine": {"max_model_len": 550}, "output": {"figures": True}})
    code, out = run(tmp_path, path)
    assert code == 0
    figures = sorted(p.name for p in (out / "figures").iterdir())
    assert "queue.png" in figures and len(figures) == 8
    results = load_results(out)
    assert (
        _nothing_ran_text(results.summary, "paged") == "nothing ran: no request finished (12 of 12 rejected)"
    )
    assert pool_labels(results.summary)["paged"].endswith(" tokens, 55.9 GiB")


def test_strict_run_with_rejections_fails_and_keeps_the_previous_result(tmp_path, capsys):
    good = config_file(tmp_path)
    code, out = run(tmp_path, good, "--strict")
    assert code == 0 and (out / MARKER).is_file()
    before = (out / "summary.csv").read_text()
    rejecting = config_file(tmp_path, {"engine": {"max_model_len": 550}})
    code, out = run(tmp_path, rejecting, "--strict")
    assert code == 1
    error = capsys.readouterr().err
    # 12 requests, every one too long, in each of the two variants
    assert "--strict: 24 request(s) were not served over 2 variants together" in error
    assert "no results written" in error
    assert (out / "summary.csv").read_text() == before, "the earlier result stays as it was"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["experiment.yaml", "out"], "no staging left"


def test_progress_bars_only_on_a_terminal(monkeypatch):
    monkeypatch.delenv("TQDM_DISABLE", raising=False)
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.setattr("sys.stderr.isatty", lambda: False)
    assert not progress_enabled()
    monkeypatch.setattr("sys.stderr.isatty", lambda: True)
    assert progress_enabled() and not progress_enabled(quiet=True)
    monkeypatch.setenv("CI", "true")
    assert not progress_enabled()


def test_a_run_without_a_terminal_logs_progress_lines_and_quiet_none(tmp_path, monkeypatch, capsys):
    """Where stderr is no terminal (CI, nohup, a pipe) a long run is not silent: plain lines at an
    interval (here 0 s, so every request arrival may print one), no bar escape sequences."""
    from sim.cli import run_progress

    monkeypatch.setenv("CI", "true")
    assert run_progress() == "log" and run_progress(quiet=True) is None
    monkeypatch.setattr("sim.outputs.progress.LOG_INTERVAL_S", 0.0)
    path = config_file(tmp_path)
    assert main(["run", str(path), "-o", str(tmp_path / "out")]) == 0
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("kvsim run small:")]
    assert lines[0].startswith("kvsim run small: contiguous-max: 1 of 12 requests (8.3%), ")
    assert any(line.startswith("kvsim run small: paged: 12 of 12 requests (100.0%)") for line in lines)
    assert all("\r" not in line and "\x1b" not in line for line in lines)
    main(["run", str(path), "-q", "-o", str(tmp_path / "out")])
    assert "requests (" not in capsys.readouterr().err


def test_progress_lines_by_hand():
    import io

    from sim.outputs.progress import LoggedProgress

    clock = [100.0]
    stream = io.StringIO()
    progress = LoggedProgress(
        "kvsim run x: paged", 1000, interval_s=30, stream=stream, clock=lambda: clock[0]
    )
    for _ in range(1000):
        clock[0] += 0.125  # 8 requests a second: a line every 240 requests
        progress.update()
    assert stream.getvalue().splitlines() == [
        "kvsim run x: paged: 240 of 1,000 requests (24.0%), 30 s, about 1.6 min left",  # 760 / 8 = 95 s
        "kvsim run x: paged: 480 of 1,000 requests (48.0%), 60 s, about 65 s left",
        "kvsim run x: paged: 720 of 1,000 requests (72.0%), 1.5 min, about 35 s left",
        "kvsim run x: paged: 960 of 1,000 requests (96.0%), 2.0 min, about 5 s left",
    ]


# ------------------------------------------------------------------------------------------------
# Listings
# ------------------------------------------------------------------------------------------------


def test_listings_and_version(capsys):
    assert main(["models"]) == 0
    models = capsys.readouterr().out
    assert "Llama-3.1-8B" in models and "131,072" in models  # context length
    assert main(["gpus"]) == 0
    assert "A100-80GB" in capsys.readouterr().out
    assert main(["policies"]) == 0
    assert "reservation = max (max | pow2 | oracle)" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    version = capsys.readouterr().out
    assert exit_.value.code == 0
    from sim.native import engine_build
    from sim.storage.folders import kvsim_version

    assert version.startswith(f"kvsim {kvsim_version()}, engine_build {engine_build()} (the compiled build ")
    in_use = "is in use" in version
    assert in_use == (engine_build() == "native"), version


def test_version_says_when_the_compiled_build_is_in_use(monkeypatch, tmp_path):
    import sim.native
    from sim.cli import version_line

    build = sim.native.NativeBuild(tmp_path, "x", "y", "group", ())
    monkeypatch.setattr(sim.native, "_active", build)
    assert version_line().endswith(f", engine_build native (the compiled build in {tmp_path} is in use)")


def test_a_tiny_negative_share_prints_as_zero():
    from sim.cli import format_summary_table
    from sim.outputs.metrics import averages_from_areas

    table = format_summary_table(
        [{"variant": "v", "mean_reserved_frac": -1e-17, "mean_used_frac": -0.0004}],
        [
            ("variant", "variant", "{}"),
            ("mean_reserved_frac", "reserv. %", "{:.1%}"),
            ("mean_used_frac", "u", "{:.2%}"),
        ],
    )
    assert table.splitlines()[1].split() == ["v", "0.0%", "-0.04%"]  # a real negative keeps its sign
    areas = averages_from_areas([-3e-15, 500.0, *([0.0] * 7)], end_s=10.0, kv_pool_tokens=100)
    assert areas["mean_used_frac"] == 0.0 and areas["mean_reserved_frac"] == 0.5


@pytest.mark.parametrize(
    ("line", "row", "message"),
    [
        (
            40,
            '{"timestamp": 39000, "input_length": -12, "output_length": 5, "hash_ids": [39]}',
            ":40: input_length is negative (-12)",
        ),
        (40, '{"timestamp": 39000, "input_len', ":40: invalid or truncated JSON"),
    ],
)
def test_a_bad_trace_row_late_in_the_file_fails_check_and_run_before_any_simulation(
    tmp_path, capsys, monkeypatch, line, row, message
):
    """A broken row is refused with its file and line by ``kvsim check`` and by ``kvsim run`` before
    the first simulation (the rows used to be read only as the engine consumed them: a row at line
    9,001 of a trace failed after 9,000 requests were simulated, and ``kvsim check`` passed the file)."""
    rows = [
        f'{{"timestamp": {1000 * index}, "input_length": 64, "output_length": 8, "hash_ids": [{index}]}}'
        for index in range(60)
    ]
    rows[line - 1] = row
    trace = tmp_path / "trace.jsonl"
    trace.write_text("\n".join(rows) + "\n")
    path = config_file(tmp_path, workload={"source": {"kind": "mooncake", "path": str(trace)}})
    assert main(["check", str(path)]) == 2
    assert f"{trace}{message}" in capsys.readouterr().err

    from sim.engine.core import Engine

    def no_simulation(*args, **kwargs):
        raise AssertionError("a simulation started")

    monkeypatch.setattr(Engine, "run", no_simulation)
    code, out = run(tmp_path, path)
    assert code == 2 and not out.exists()
    assert f"{trace}{message}" in capsys.readouterr().err
    rows[line - 1] = rows[0].replace('"timestamp": 0,', '"timestamp": 39000,')
    trace.write_text("\n".join(rows) + "\n")
    assert main(["check", str(path)]) == 0  # (the same file mended, once more from the top)


def test_a_repeated_key_is_warned_of_once_with_both_lines_and_the_last_value_is_used(tmp_path, capsys):
    """YAML keeps the last of a mapping's repeated keys; kvsim used to say nothing. Line 5 repeats
    ``engine`` (lines 3 and 5 hold the two sections) and line 4 ``block_size`` inside the first."""
    path = tmp_path / "repeated.yaml"
    path.write_text(
        "name: repeated\n"  # 1
        "seed: 1\n"  # 2
        "engine: {max_model_len: 2048, block_size: 16,\n"  # 3
        "  block_size: 32}\n"  # 4
        "engine: {max_model_len: 4096}\n"  # 5
        "model: Llama-3.1-8B\ngpu: A100-80GB\n"
        "workload: {num_requests: 4, arrival: {kind: poisson, rate_per_s: 5}, prompt_len: 100, output_len: 10}\n"
        "variants: [{name: p, policy: paged}]\n",
        encoding="utf-8",
    )
    assert main(["check", str(path)]) == 0
    warned = [line for line in capsys.readouterr().err.splitlines() if "repeats" in line]
    assert warned == [
        f"kvsim: warning: {path}: line 5: key 'engine' repeats the one at line 3 of the same mapping; "
        "only the value at line 5 is used",
        f"kvsim: warning: {path}: line 4: key 'block_size' repeats the one at line 3 of the same mapping; "
        "only the value at line 4 is used",
    ]
    assert load_experiment(path).engine.max_model_len == 4096
    assert load_experiment(path).engine.block_size == 16  # (the second engine section has none)


def test_the_key_checking_loader_reads_every_shipped_file_as_the_safe_loader_does():
    from sim.yaml_input import load_yaml

    shipped = sorted(ROOT.glob("configs/**/*.yaml"))
    assert len(shipped) > 30
    for path in shipped:
        text = path.read_text(encoding="utf-8")
        assert load_yaml(text) == (yaml.safe_load(text), []), path
    merged = "base: &base {a: 1, b: 2}\nderived:\n  <<: *base\n  b: 3\n"
    assert load_yaml(merged) == ({"base": {"a": 1, "b": 2}, "derived": {"a": 1, "b": 3}}, [])


def test_an_unknown_sweep_key_with_a_bracket_is_named_with_the_keys_a_sweep_takes(tmp_path, capsys):
    """Plan and sweep errors dropped every location part with a ``[`` (taken for pydantic's union
    tags): an unknown key ``bogus_ke[y`` left no key at all and raised IndexError. The keys offered
    are the ones a file writes (``set``, ``zip``), not the fields' names (``overrides``)."""
    path = tmp_path / "sweep.yaml"
    path.write_text(
        f"name: s\nbase: {ROOT / 'configs' / 'quickstart.yaml'}\n"
        "axes: {engine.block_size: [16, 32]}\nbogus_ke[y: 1\n",
        encoding="utf-8",
    )
    assert main(["check", str(path)]) == 2
    assert (
        "  bogus_ke[y: unknown key; valid: axes, base, description, experiment, name, set, zip (got 1)"
        in capsys.readouterr().err
    )


@pytest.mark.parametrize("value", [float("inf"), float("-inf"), float("nan")])
def test_an_infinite_or_nan_distribution_parameter_is_refused_naming_its_key(tmp_path, value):
    """A lognormal given by its mean with sigma .inf has mu = log(mean) - inf: it drew NaN lengths,
    cast to -2**63 (numpy's 'invalid value encountered in cast'). Workload numbers must be finite."""
    path = config_file(tmp_path, {"workload.prompt_len": {"kind": "lognormal", "mean": 100, "sigma": value}})
    with pytest.raises(ConfigError, match=r"workload\.prompt_len\.sigma: Input should be a finite number"):
        prepare(path)


def test_an_infinite_plan_setting_is_refused_naming_its_key(tmp_path, capsys):
    """``search.min_duration_s: .inf`` raised OverflowError from the probe sizing (found by
    ``make fuzz-bad-input``): plan, sweep, replay and experiment numbers must be finite."""
    source = ROOT / "configs" / "plan" / "cluster-routers-l4.yaml"
    data = yaml.safe_load(source.read_text())
    data.setdefault("search", {})["min_duration_s"] = float("inf")
    path = tmp_path / source.name
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    assert main(["check", str(path)]) == 2
    assert "search.min_duration_s: Input should be a finite number (got inf)" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("changes", "top", "message"),
    [
        (
            {},
            {"cluster": {"replicas": 2**63}},
            "cluster.replicas: Input should be less than or equal to 1024",
        ),
        (
            {"engine.data_parallel_size": 1025},
            {},
            "engine.data_parallel_size: Input should be less than or equal to 1024",
        ),
    ],
)
def test_more_engines_than_a_run_can_build_are_refused_naming_the_key(tmp_path, changes, top, message):
    """Every replica and rank holds its pool's books in memory, built before the first simulation:
    2**63 replicas exhausted memory (found by ``make fuzz-bad-input``). At most 1,024."""
    path = config_file(tmp_path, changes, **top)
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_experiment(path)


def test_a_plan_candidates_drafts_that_cannot_fit_a_sequence_are_refused_by_check(tmp_path, capsys):
    """The plan's candidates are prepared as its runs would be, speculative knobs included (they were
    not: ``num_speculative_tokens`` past ``max_model_len`` was found only by the candidate's run)."""
    source = ROOT / "configs" / "plan" / "llama31-8b-speculative-h100.yaml"
    data = yaml.safe_load(source.read_text())
    data["workload"]["length_pairs"]["path"] = str(
        (source.parent / data["workload"]["length_pairs"]["path"]).resolve()
    )
    data["candidates"]["engine"]["speculative"][1]["num_speculative_tokens"] = 9000
    path = tmp_path / source.name
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    assert main(["check", str(path)]) == 2
    assert (
        "engine.speculative.num_speculative_tokens: 9000 drafts per step cannot sit in a sequence of "
        "max_model_len 8192" in capsys.readouterr().err
    )
