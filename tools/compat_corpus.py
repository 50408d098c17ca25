"""Regenerate ``tests/compat/``: every experiment, plan, sweep and replay file kvsim has shipped.

The corpus is what kvsim promised would run: every version, in the git history of HEAD (``--all``:
of every branch; the two agree while every branch descends from main), of the YAML files of
``configs/`` and of the README's YAML examples, each distinct content once, named after the commit
that first shipped it. HEAD's history by default, so that what the corpus should hold depends on
the commit checked out, not on which other branches a clone has. ``tests/test_compat.py`` checks each file with
``kvsim check`` (and runs a few end to end), so a change that breaks a file users were given fails
a test instead of a user.

The files keep their text; a header comment says where each came from. They lie in one folder two
levels below the project root, as ``configs/<folder>/`` files do, so that their relative paths to
the project's data (``../../traces/...``, ``../../reference_runs/...``) still resolve; data named from
the project root (``traces/...``) resolves from anywhere. What had to be completed to make a whole
file is said in its header and in ``tests/compat/README.md``:

* a sweep's ``base:`` names the corpus copy of the base file as it was at the sweep's commit
  (``../quickstart.yaml`` would be ``tests/quickstart.yaml`` from here);
* the README's experiment example has ``workload: {...}`` (see below in the README): the
  quickstart's workload of the same commit takes its place;
* the README's ``cluster:`` examples are sections: each is appended to the shipped example it
  introduces (``configs/cluster-chat-routers.yaml``, ``configs/disaggregated-chat.yaml``, as of the
  same commit) in place of that file's own ``cluster:`` sections, so that every variant runs it.

Left out: ``configs/profiles/`` (cost-model profiles, read through an experiment's ``cost_model``)
and ``configs/validation/`` (``kvsim validate`` claim files); neither is one of the four kinds.

    .venv/bin/python tools/compat_corpus.py          # rewrite tests/compat/ from the git history
    .venv/bin/python tools/compat_corpus.py --check  # exit 1 if tests/compat/ differs from it
"""

from __future__ import annotations

import argparse
import hashlib
import json
import posixpath
import re
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "tests" / "compat"
MANIFEST = "manifest.json"
README = "README.md"

KIND_OF_FOLDER = {"plan": "plan", "sweep": "sweep", "replays": "replay"}
"""configs/<folder>/ -> the kind of its files; every other folder (and configs/ itself) holds experiments."""

LEFT_OUT = {
    "configs/profiles/": "cost-model profiles (read through an experiment's cost_model; tests/test_costs.py)",
    "configs/validation/": "`kvsim validate` claim files (tests/test_validation.py)",
}
"""Folders of configs/ whose YAML files are not experiment, plan, sweep or replay files, and why."""

CLUSTER_HOSTS = {
    "cluster": "configs/cluster-chat-routers.yaml",
    "disaggregation": "configs/disaggregated-chat.yaml",
}
"""The shipped experiment each README `cluster:` example is completed with (a disaggregation example
goes into the disaggregated one)."""

QUICKSTART = "configs/quickstart.yaml"
WORKLOAD_PLACEHOLDER = re.compile(r"^workload: \{\.\.\.\}.*$", re.MULTILINE)
YAML_BLOCK = re.compile(r"^```ya?ml\n(.*?)^```", re.MULTILINE | re.DOTALL)


@dataclass(frozen=True)
class Entry:
    """One corpus file and where it came from."""

    file: str  # name in tests/compat/
    kind: str  # experiment | plan | sweep | replay
    source: str  # configs/<path>, or README.md (a YAML example)
    commit: str  # the first commit that shipped this content
    date: str
    completed: str  # what was added or rewritten to make a whole, loadable file ("" when nothing)


@dataclass(frozen=True)
class Commit:
    sha: str
    short: str
    date: str


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, check=True, capture_output=True, text=True).stdout


def commits_touching(path: str, history: str) -> list[Commit]:
    """Every commit of ``history`` (``HEAD``, or ``--all`` branches) that changed ``path``, oldest first."""
    lines = git("log", history, "--reverse", "--format=%H %h %cs", "--", path).splitlines()
    return [Commit(*line.split()) for line in lines]


def file_at(commit: Commit, path: str) -> str | None:
    """``path``'s text at ``commit``; None where it did not exist (deleted, or not yet added)."""
    try:
        return git("show", f"{commit.sha}:{path}")
    except subprocess.CalledProcessError:
        return None


def shipped_config_paths(history: str) -> list[str]:
    names = git("log", history, "--format=", "--name-only", "--", "configs/").split()
    return sorted(
        {name for name in names if name.endswith((".yaml", ".yml")) and not name.startswith(tuple(LEFT_OUT))}
    )


def kind_of(path: str) -> str:
    parts = Path(path).parts
    return KIND_OF_FOLDER.get(parts[1], "experiment") if len(parts) > 2 else "experiment"


def corpus_name(source: str, commit: Commit) -> str:
    """``configs/traces/mooncake.yaml`` at abc1234 -> ``traces.mooncake@abc1234.yaml``."""
    inner = Path(source).relative_to("configs").with_suffix("")
    return f"{'.'.join(inner.parts)}@{commit.short}.yaml"


class Corpus:
    """The files being gathered, each distinct text once (the first commit that shipped it names it)."""

    def __init__(self, history: str) -> None:
        self.history = history  # HEAD: the commits this version descends from; --all: every branch's
        self.texts: dict[str, str] = {}  # file name -> text (header included)
        self.entries: list[Entry] = []
        self._seen: dict[str, str] = {}  # sha256 of the shipped text -> file name
        self._versions: dict[tuple[str, str], str] = {}  # (source path, commit sha) -> file name

    def add(self, entry: Entry, shipped: str, text: str) -> str:
        digest = hashlib.sha256(shipped.encode()).hexdigest()
        if digest in self._seen:
            return self._seen[digest]
        self._seen[digest] = entry.file
        self.texts[entry.file] = header(entry) + text
        self.entries.append(entry)
        return entry.file

    def version_of(self, source: str, commit: Commit) -> str | None:
        """The corpus file holding ``source`` as it was at ``commit``."""
        return self._versions.get((source, commit.sha))

    def gather_configs(self) -> None:
        """Every version of every shipped config file; sweeps last, so that their bases are in."""
        paths = sorted(shipped_config_paths(self.history), key=lambda path: kind_of(path) == "sweep")
        for path in paths:
            for commit in commits_touching(path, self.history):
                text = file_at(commit, path)
                if text is None:
                    continue
                completed, whole = "", text
                if kind_of(path) == "sweep":
                    completed, whole = self._base_in_corpus(text, path, commit)
                entry = Entry(
                    corpus_name(path, commit), kind_of(path), path, commit.short, commit.date, completed
                )
                self._versions[(path, commit.sha)] = self.add(entry, text, whole)

    def _base_in_corpus(self, text: str, path: str, commit: Commit) -> tuple[str, str]:
        """The sweep's ``base:`` pointed at the corpus copy of its base file as of ``commit``."""
        base = (yaml.safe_load(text) or {}).get("base")
        if not isinstance(base, str):
            return "", text
        base_path = posixpath.normpath(posixpath.join(posixpath.dirname(path), base))
        copy = self.copy_at(base_path, commit)
        rewritten = re.sub(rf"^base: *{re.escape(base)}", f"base: {copy}", text, count=1, flags=re.MULTILINE)
        return f"base: {base} -> {copy} (the corpus copy of {base_path} at {commit.short})", rewritten

    def copy_at(self, source: str, commit: Commit) -> str:
        """The corpus file of ``source``'s version at ``commit`` (the last commit that changed it)."""
        last = git("log", "-1", "--format=%H %h %cs", commit.sha, "--", source).split()
        if not last:
            raise SystemExit(f"{source} does not exist at {commit.short}")
        name = self._versions.get((source, last[0]))
        if name is None:
            raise SystemExit(f"{source} at {last[1]} is not in the corpus (gathered after what uses it?)")
        return name

    def gather_readme(self) -> None:
        """The README's YAML examples, each distinct text once, completed into whole files."""
        examples: dict[str, Commit] = {}
        for commit in commits_touching("README.md", self.history):
            for block in YAML_BLOCK.findall(file_at(commit, "README.md") or ""):
                examples.setdefault(block, commit)
        for block, commit in examples.items():
            kind, label, completed, text = self._complete(block, commit)
            entry = Entry(
                f"readme.{label}@{commit.short}.yaml", kind, "README.md", commit.short, commit.date, completed
            )
            self.add(entry, block, text)

    def _complete(self, block: str, commit: Commit) -> tuple[str, str, str, str]:
        """(kind, label, what was completed, whole text) of one README example."""
        data = yaml.safe_load(block) or {}
        if set(data) == {"cluster"}:
            label = "disaggregation" if "disaggregation" in data["cluster"] else "cluster"
            host = CLUSTER_HOSTS[label]
            text = (
                without_cluster(file_at(commit, host) or "") + "# The README's example, as written:\n" + block
            )
            completed = f"a section: {host} (as of {commit.short}) runs it in every variant"
            return "experiment", label, completed, text
        if "axes" in data or "zip" in data:
            completed, text = self._base_in_corpus(block, "configs/sweep/README-example.yaml", commit)
            return "sweep", "sweep", completed, text
        if WORKLOAD_PLACEHOLDER.search(block):
            workload = (yaml.safe_load(file_at(commit, QUICKSTART) or "") or {}).get("workload")
            line = "workload: " + json.dumps(workload) + f"  # {QUICKSTART}'s at {commit.short}"
            text = WORKLOAD_PLACEHOLDER.sub(lambda match: line, block)
            return "experiment", "experiment", f"workload: {{...}} -> {QUICKSTART}'s workload", text
        return "experiment", "experiment", "", block


def without_cluster(text: str) -> str:
    """An experiment's YAML without its ``cluster:`` section and its variants' overrides of it, so
    that a ``cluster:`` section appended after it is what every variant runs."""
    data = yaml.safe_load(text)
    data.pop("cluster", None)
    for variant in data.get("variants", []):
        variant.pop("cluster", None)
    return yaml.safe_dump(data, sort_keys=False)


def header(entry: Entry) -> str:
    lines = [
        "# kvsim compatibility corpus (tools/compat_corpus.py writes it; do not edit): "
        f"{entry.source} as first shipped in {entry.commit} ({entry.date})",
    ]
    if entry.completed:
        lines.append(f"# completed to load: {entry.completed}")
    return "\n".join(lines) + "\n"


def readme(entries: list[Entry]) -> str:
    kinds = sorted({entry.kind for entry in entries})
    counts = ", ".join(f"{sum(entry.kind == kind for entry in entries)} {kind}" for kind in kinds)
    commits = sorted({entry.commit for entry in entries})
    lines = [
        "# Compatibility corpus",
        "",
        "Every experiment, plan, sweep and replay file kvsim has shipped: each version of the YAML files",
        "of `configs/` in the history of HEAD, and of the README's YAML examples, each distinct text once,",
        f"named after the first commit that shipped it. {len(entries)} files: {counts}, from "
        f"{len(commits)} commits.",
        "`tests/test_compat.py` checks each with `kvsim check` (no simulation) and runs a few end to",
        "end; `.venv/bin/python tools/compat_corpus.py` regenerates this folder from the git history",
        "(`--check`: fails when it is out of date). Generated: do not edit.",
        "",
        "The files lie two levels below the project root, as `configs/<folder>/` files do, so their",
        "relative paths to the project's data still resolve. Completed to make whole files (each",
        "file's header says how):",
        "",
        "* a sweep's `base:` names the corpus copy of its base file as of the sweep's commit;",
        "* the README's experiment example has `workload: {...}`: the quickstart's workload of that",
        "  commit takes its place;",
        "* the README's `cluster:` examples are sections: each is appended to the shipped example it",
        "  introduces, as of that commit, in place of that file's own `cluster:` sections (its",
        "  variants' included), so that every variant runs it.",
        "",
        "Not checked where the data is absent: the replays of `reference_runs/blis-h100-vllm-0.15/`,",
        "whose measured runs are not redistributed (that folder's README says where to fetch them).",
        "",
        "Left out (not one of the four kinds): "
        + "; ".join(f"`{folder}`: {why}" for folder, why in LEFT_OUT.items())
        + ".",
        "",
        "| file | kind | from | first shipped in | completed |",
        "|---|---|---|---|---|",
    ]
    for entry in entries:
        lines.append(
            f"| `{entry.file}` | {entry.kind} | `{entry.source}` | {entry.commit} ({entry.date}) | "
            f"{entry.completed.replace('|', '/') or '-'} |"
        )
    return "\n".join(lines) + "\n"


def generate(history: str = "HEAD") -> dict[str, str]:
    """File name -> text of every file tests/compat/ should hold (YAML files, manifest, README),
    from the commits of ``history``."""
    corpus = Corpus(history)
    corpus.gather_configs()
    corpus.gather_readme()
    entries = sorted(corpus.entries, key=lambda entry: (entry.kind, entry.file))
    files = dict(corpus.texts)
    files[MANIFEST] = json.dumps([asdict(entry) for entry in entries], indent=1) + "\n"
    files[README] = readme(entries)
    return files


def written_before() -> set[str]:
    """The files an earlier run of this tool wrote (its manifest's, the manifest and README): the only
    ones it may delete; anything else in tests/compat/ is somebody's and stays."""
    manifest = CORPUS / MANIFEST
    if not manifest.is_file():
        return set()
    return {entry["file"] for entry in json.loads(manifest.read_text(encoding="utf-8"))} | {MANIFEST, README}


def differences(files: dict[str, str]) -> list[str]:
    present = {path.name for path in CORPUS.glob("*") if path.is_file()}
    problems = [f"missing: {name}" for name in sorted(set(files) - present)]
    problems += [f"not generated: {name}" for name in sorted(present - set(files))]
    problems += [
        f"differs: {name}"
        for name in sorted(set(files) & present)
        if (CORPUS / name).read_text(encoding="utf-8") != files[name]
    ]
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="compare with tests/compat/; write nothing")
    parser.add_argument(
        "--all",
        action="store_true",
        help="every branch's history (default: HEAD's, the commits this version descends from)",
    )
    args = parser.parse_args(argv)
    files = generate("--all" if args.all else "HEAD")
    if args.check:
        problems = differences(files)
        for problem in problems:
            print(f"tests/compat/: {problem}", file=sys.stderr)
        return 1 if problems else 0
    CORPUS.mkdir(parents=True, exist_ok=True)
    for stale in written_before() - set(files):
        (CORPUS / stale).unlink(missing_ok=True)
    for name, text in files.items():
        (CORPUS / name).write_text(text, encoding="utf-8")
    print(f"tests/compat/: {len(files) - 2} corpus files, {MANIFEST}, {README}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
