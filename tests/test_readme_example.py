"""README's "Adding a method" example works as written: the file dropped into ``methods/`` is
found without any other edit, passes the contract tests on both domains, and its config line
puts it in the planned jobs of Table 1."""

from __future__ import annotations

import re
import sys

import pytest

import methods
from methods.core import registry

from . import test_contract
from .conftest import DOMAINS
from .test_pipeline import ROOT, _copy_repo, _snakemake

README = (ROOT / "README.md").read_text()


def _block(lang: str, first_line: str) -> str:
    """The fenced ``lang`` block of README whose first line is ``first_line``."""
    for body in re.findall(rf"```{lang}\n(.*?)```", README, re.S):
        if body.startswith(first_line):
            return body
    raise AssertionError(f"README has no {lang} block starting {first_line!r}")


EXAMPLE = _block("python", "# methods/rloo.py")
CONFIG_LINE = _block("yaml", "  rloo:").rstrip("\n")


@pytest.fixture
def rloo_dropped_in(tmp_path):
    """``methods/rloo.py`` as README writes it, in a directory on the ``methods`` package's path
    (the repository's own ``methods/`` stays untouched); removed again afterwards."""
    extra = tmp_path / "extra_methods"
    extra.mkdir()
    (extra / "rloo.py").write_text(EXAMPLE)
    methods.__path__.append(str(extra))
    try:
        yield extra
    finally:
        methods.__path__.remove(str(extra))
        sys.modules.pop("methods.rloo", None)
        registry._METHODS.pop("rloo", None)


def test_a_dropped_in_file_is_a_method(rloo_dropped_in):
    assert "methods.rloo" in registry.method_modules()
    assert "rloo" in registry.known_methods()
    cls = registry.get_method("rloo")
    with pytest.raises(ValueError, match="group_size"):
        cls.Config(group_size=1)


def test_the_builtin_methods_are_found_by_their_files():
    assert set(registry.known_methods()) >= {"grpo", "retrieval_rl", "opsd", "sdpo", "sdft", "skill_sd", "lopd"}
    assert not any(m.startswith("methods.core") for m in registry.method_modules())


@pytest.mark.slow  # the contract tests it delegates to are slow
@pytest.mark.parametrize("domain_name", DOMAINS)
def test_the_example_passes_the_contract(domain_name, rloo_dropped_in, warmstarts, seeded_banks, tmp_path):
    test_contract.test_two_steps_change_parameters_and_spend_the_budget(
        "rloo", domain_name, warmstarts, seeded_banks, tmp_path
    )


@pytest.mark.slow
def test_the_example_resumes_exactly(rloo_dropped_in, warmstarts, seeded_banks, tmp_path):
    test_contract.test_resume_after_interruption_matches_uninterrupted_run("rloo", warmstarts, seeded_banks, tmp_path)


@pytest.mark.slow
def test_one_config_line_puts_it_in_table1(tmp_path):
    _copy_repo(tmp_path)
    (tmp_path / "methods" / "rloo.py").write_text(EXAMPLE)
    cfg = tmp_path / "config" / "config.yaml"
    text = cfg.read_text()
    assert "\nmethods:\n" in text
    cfg.write_text(text.replace("\nmethods:\n", f"\nmethods:\n{CONFIG_LINE}\n", 1))
    dry = _snakemake(tmp_path, "results/smoke/table1.csv", "--config", "profile=smoke", "--dry-run")
    assert dry.returncode == 0, dry.stdout + dry.stderr
    planned = set(re.findall(r"domain=(\w+), method=rloo, seed=(\d+)", dry.stdout))
    assert {d for d, _ in planned} == set(DOMAINS), dry.stdout[-3000:]


def test_an_installed_package_adds_a_method_through_an_entry_point(tmp_path, monkeypatch):
    """A baseline may live in another package: an entry point of the group lopd_bench.methods
    names its module, which registers it."""
    import importlib.metadata

    pkg = tmp_path / "site" / "extbaselines"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "rloo.py").write_text(EXAMPLE)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    ep = importlib.metadata.EntryPoint(name="rloo", value="extbaselines.rloo", group=registry.ENTRY_POINT_GROUP)
    real = importlib.metadata.entry_points

    def fake(**kw):
        return [ep] if kw.get("group") == registry.ENTRY_POINT_GROUP else real(**kw)

    monkeypatch.setattr(importlib.metadata, "entry_points", fake)
    try:
        assert "extbaselines.rloo" in registry.method_modules()
        assert "rloo" in registry.known_methods() and registry.get_method("rloo").__module__ == "extbaselines.rloo"
    finally:
        sys.modules.pop("extbaselines.rloo", None)
        sys.modules.pop("extbaselines", None)
        registry._METHODS.pop("rloo", None)
