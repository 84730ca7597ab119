"""A peer's crash is a finding (`peer`): in the helper, the audits, the benchmark and the chapters."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest
import transformers
from conftest import torch_threads

from specdec_ref import peer
from specdec_ref.peer import call_peer, crash_outcome, first_line, peer_sites, tally

ROOT = Path(__file__).resolve().parent.parent
RESHAPE = ("cannot reshape tensor of 0 elements into shape [1, 0, -1, 48] because the unspecified "
           "dimension size -1 can be any value and is ambiguous\nsecond line of the message")


def crashing_peer(*args, **kwargs):
    """A fake `generate` that fails as transformers 5.25's cross-tokenizer greedy path does."""
    raise RuntimeError(RESHAPE)


def test_a_peer_crash_is_an_outcome_with_its_first_line_and_version():
    """The error does not propagate: the outcome holds the error's first line, what was called and the version."""
    outcome = call_peer("generate(assistant_model=...)", crashing_peer, 1, k=2)
    assert outcome.crashed and outcome.value is None and outcome.verdict(True) == "crashed"
    assert outcome.error == "RuntimeError: " + RESHAPE.splitlines()[0]
    assert outcome.version == transformers.__version__
    finding = outcome.finding()
    assert all(len(line) <= 80 for line in finding.splitlines())
    assert finding.startswith(f"transformers {transformers.__version__}: generate(assistant_model=...) crashed")
    assert "second line" not in finding and crash_outcome("x", RuntimeError(RESHAPE)).error == outcome.error


def test_a_peer_that_runs_gives_its_value_and_a_verdict_of_what_it_did():
    """A call that returns is "matched" or "differed" as the caller's comparison says, "ran" without one."""
    outcome = call_peer("f", lambda x: x + 1, 1)
    assert not outcome.crashed and outcome.value == 2 and outcome.error is None
    assert (outcome.verdict(True), outcome.verdict(False), outcome.verdict()) == ("matched", "differed", "ran")
    assert first_line(ValueError()) == "ValueError" and first_line("a\nb") == "a"


def test_tally_counts_verdicts_for_prose():
    """Counts in a fixed order, joined for a sentence; an empty list or an unknown word is refused."""
    assert tally(["matched"] * 4) == "matched in 4 of 4 cases"
    assert tally(["crashed", "matched", "differed", "matched"]) == (
        "matched in 2, differed in 1 and crashed in 1 of 4 cases")
    for bad in ([], ["passed"]):
        with pytest.raises(ValueError, match="verdicts"):
            tally(bad)


def test_peer_sites_are_read_from_the_installed_source():
    """Every site found names a line of the installed file that holds the text it reports; with
    `AssistantToTargetTranslator` installed, all six are found, the map inside its method."""
    from transformers.generation import candidate_generator

    found, missing = peer_sites()
    root = Path(transformers.__file__).parent
    for site in found.values():
        lines = (root / site.file).read_text().splitlines()
        assert lines[site.first - 1].strip() == site.text and site.first <= site.last
    if hasattr(candidate_generator, "AssistantToTargetTranslator"):
        assert not missing and set(found) == {"map", "prune", "write", "head", "embeddings", "cache"}
        assert found["map"].text.startswith("for ") and "assistant_vocab.items()" in found["map"].text
        assert found["prune"].first <= found["head"].first == found["prune"].last < found["embeddings"].first
        assert "-" in found["write"].lines and found["cache"].text.startswith("class ")


def test_peer_sites_say_what_a_release_lacks(monkeypatch):
    """A release without the translator: every site is reported missing, nothing raises."""
    monkeypatch.setitem(sys.modules, "fake_candidates", types.ModuleType("fake_candidates"))
    found, missing = peer_sites(module="fake_candidates")
    assert found == {} and len(missing) == len(peer.TRANSLATOR_SITES)
    assert all("not in fake_candidates" in line for line in missing)
    assert peer_sites(module="no_such_module_here")[0] == {}


def test_vocab_audit_records_a_crash_of_transformers_and_runs_on(monkeypatch):
    """A `transformers` that crashes in every cross-tokenizer call: the report says so, row by row, with
    the error's first line, and the package's rows still run."""
    from specdec_ref.bench import vocab_audit

    monkeypatch.setattr(vocab_audit, "transformers_cross", lambda pair, sampling, config: crashing_peer)
    data = vocab_audit.run_audit(vocab_audit.VocabAuditConfig(num_runs=2, max_new_tokens=8, greedy_prompts=1,
                                                              greedy_new_tokens=4))
    first = "RuntimeError: " + RESHAPE.splitlines()[0]
    theirs = [row for row in data["sampled"] + data["greedy"] if row["implementation"].startswith("transformers")]
    assert len(theirs) == 2 and all(row["error"] == first and not row["passed"] for row in theirs)
    reuse = data["transformers_draft_reuse"]
    assert reuse["sampled_call_error"] == first == reuse["greedy_call_after_sampled_call_error"]
    ours = [row for row in data["greedy"] if row["implementation"].startswith("specdec_ref")]
    assert ours and all(row["passed"] for row in ours)


def test_a_crashing_assisted_arm_is_recorded_in_the_benchmark_report(monkeypatch, tmp_path):
    """transformers' assisted arms crash: the benchmark still writes its report, with the crashes in
    `meta.peer_crashes`, no assisted arm in `arms`, and a headline and table that say none ran."""
    from specdec_ref.bench import arms as bench_arms
    from specdec_ref.bench.run import format_table, main

    real = bench_arms.ArmRunner._generate

    def generate(self, arm, input_ids, seed):
        if arm.impl == "transformers" and arm.speculative:
            crashing_peer()
        return real(self, arm, input_ids, seed)

    monkeypatch.setattr(bench_arms.ArmRunner, "_generate", generate)
    out = tmp_path / "bench.json"
    argv = ["--pair", "random", "--quick", "--max-new-tokens", "6", "--k-values", "2", "--modes", "greedy",
            "--threads", "1", "--random-target-layers", "1", "--random-width", "32", "--random-vocab", "64",
            "--no-progress", "--out", str(out)]
    with torch_threads():
        report = main(argv)
    crashes = json.loads(out.read_text())["meta"]["peer_crashes"]
    assert {crash["arm"] for crash in crashes} == {"hf assisted default", "hf assisted k=2"}
    assert all(crash["error"].startswith("RuntimeError: cannot reshape") for crash in crashes)
    assert not any(arm["impl"] == "transformers" and arm["schedule"] for arm in report["arms"])
    assert report["headline"]["greedy"]["best_assisted"] is None
    assert "no assisted arm ran" in format_table(report) and "crashed: RuntimeError" in format_table(report)


@pytest.mark.parametrize("notebook", sorted((ROOT / "notebooks").glob("*.ipynb")), ids=lambda p: p.stem)
def test_chapters_that_call_assisted_generation_treat_its_crash_as_a_finding(notebook):
    """A chapter that calls `transformers`' assisted generation goes through `peer` (a crash printed as
    a finding) and asserts nothing of the peer's verdict."""
    cells = json.loads(notebook.read_text())["cells"]
    code = "\n".join("".join(cell["source"]) for cell in cells if cell["cell_type"] == "code")
    if "assistant_model=" not in code and "transformers_assisted(" not in code:
        return
    assert "call_peer(" in code or "crash_outcome(" in code, f"{notebook.name}: a peer's crash would fail a cell"
    for line in code.splitlines():
        assert not (line.lstrip().startswith("assert") and '["transformers"].passed' in line), line
