"""Shipped base policies: manifest, install checks, rebuild comparison, and the shipped files themselves."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from methods.stages import shipped

ROOT = Path(__file__).resolve().parents[1]
JOB = {
    "profile": "p",
    "domain": "code",
    "warmstart": {"steps": 3},
    "train": {"eval_episodes": 4, "temperature": 0.7, "lr": 0.1},
}


def _fake_base(path: Path, weights: bytes = b"\x00\x01weights") -> Path:
    (path / "model").mkdir(parents=True)
    (path / "model" / "model.safetensors").write_bytes(weights)
    (path / "model" / "config.json").write_text('{"hidden_size": 8}')
    (path / "eval.json").write_text(json.dumps({"heldout_reward": 0.25, "wall_s": 1.0, "job": JOB, "seed": 0}))
    return path


def test_ship_install_round_trip_copies_every_byte(tmp_path):
    src = _fake_base(tmp_path / "built")
    m = shipped.ship(src, tmp_path / "base" / "p" / "code", JOB, 0, "code-v6", {"git": "x"})
    assert set(m["files"]) == {"eval.json", "model/config.json", "model/model.safetensors"} and m["scores"] == {
        "heldout_reward": 0.25
    }
    assert shipped.verify(tmp_path / "base" / "p" / "code") == []
    out = tmp_path / "ws"
    shipped.install(tmp_path / "base" / "p" / "code", out, JOB, 0, "code-v6")
    assert shipped.file_hashes(out) == shipped.file_hashes(src)
    assert shipped.matches("p", "tooluse", JOB, 0, "x", root=tmp_path) == (None, None)  # nothing shipped


def test_matches_names_what_differs(tmp_path):
    dst = shipped.shipped_dir("p", "code", tmp_path)
    shipped.ship(_fake_base(tmp_path / "built"), dst, JOB, 0, "code-v6", {})
    assert shipped.matches("p", "code", JOB, 0, "code-v6", root=tmp_path) == (dst, None)
    other = {**JOB, "warmstart": {"steps": 4}}
    assert shipped.matches("p", "code", other, 0, "code-v6", root=tmp_path) == (None, "settings warmstart.steps")
    assert "seed 0 (wanted 1)" in shipped.matches("p", "code", JOB, 1, "code-v6", root=tmp_path)[1]
    assert (
        "domain version code-v6 (tasks are now code-v7)"
        in shipped.matches("p", "code", JOB, 0, "code-v7", root=tmp_path)[1]
    )


def test_install_refuses_a_tampered_or_mismatched_base_and_writes_nothing(tmp_path):
    dst = shipped.shipped_dir("p", "code", tmp_path)
    shipped.ship(_fake_base(tmp_path / "built"), dst, JOB, 0, "code-v6", {})
    with pytest.raises(ValueError, match="other settings"):
        shipped.install(dst, tmp_path / "ws1", {**JOB, "train": {**JOB["train"], "temperature": 1.0}}, 0, "code-v6")
    (dst / "model" / "model.safetensors").write_bytes(b"\x00\x02weights")
    with pytest.raises(ValueError, match="model/model.safetensors"):
        shipped.install(dst, tmp_path / "ws2", JOB, 0, "code-v6")
    assert not (tmp_path / "ws1").exists() and not (tmp_path / "ws2").exists()


def test_compare_tells_bit_identical_from_different(tmp_path):
    dst = shipped.shipped_dir("p", "code", tmp_path)
    shipped.ship(_fake_base(tmp_path / "built"), dst, JOB, 0, "code-v6", {})
    same = shipped.compare(_fake_base(tmp_path / "again"), dst)
    assert same["bit_identical"] and same["scores_equal"] and same["model_files_differ"] == []
    diff = shipped.compare(_fake_base(tmp_path / "other", weights=b"\x00\x01weightz"), dst)
    assert not diff["bit_identical"] and diff["model_files_differ"] == ["model/model.safetensors"]


def _shipped_manifests():
    return sorted((ROOT / shipped.SHIPPED_ROOT).glob("*/*/" + shipped.MANIFEST))


@pytest.mark.parametrize("manifest", _shipped_manifests(), ids=lambda p: f"{p.parent.parent.name}/{p.parent.name}")
def test_shipped_base_matches_its_configuration(manifest):
    """Every base policy in the repository is what its profile's configuration builds: same job,
    seed and task version, and every file's bytes as its manifest records."""
    from methods.core.config import profile_section, resolve_job
    from tasks.base import get_domain

    profile, domain = manifest.parent.parent.name, manifest.parent.name
    config = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    config["profile"] = profile
    job = resolve_job(config, domain)
    d = get_domain(domain, seed=job["task_seed"], **job["domain_options"])
    seed = profile_section(config).get("base_seed", 0)
    assert shipped.mismatch(json.loads(manifest.read_text()), job, seed, d.version) is None
    assert shipped.verify(manifest.parent) == []


def test_the_runs_own_settings_do_not_define_the_base_policy(tmp_path):
    """Only the sampling settings of the base's on-policy stage define its weights; a shipped base
    fits any budget, learning rate or evaluation size, and the evaluation settings that differ are
    named (the install evaluates it again for them)."""
    dst = shipped.shipped_dir("p", "code", tmp_path)
    shipped.ship(_fake_base(tmp_path / "built"), dst, JOB, 0, "code-v6", {})
    runs_own = {**JOB, "train": {**JOB["train"], "lr": 0.2, "eval_episodes": 12, "rollout_budget": 64}}
    assert shipped.matches("p", "code", runs_own, 0, "code-v6", root=tmp_path) == (dst, None)
    assert shipped.evaluation_differs(JOB, runs_own) == ["train.eval_episodes"]
    assert shipped.evaluation_differs(JOB, {**JOB, "train": {**JOB["train"], "lr": 0.2}}) == []
    sampling = {**JOB, "train": {**JOB["train"], "max_new_tokens": 9}}
    assert shipped.matches("p", "code", sampling, 0, "code-v6", root=tmp_path) == (
        None,
        "settings train.max_new_tokens",
    )


def test_a_profile_name_is_not_a_setting(tmp_path):
    dst = shipped.shipped_dir("p", "code", tmp_path)
    shipped.ship(_fake_base(tmp_path / "built"), dst, {**JOB, "profile": "experiment"}, 0, "code-v6", {})
    assert shipped.matches("p", "code", JOB, 0, "code-v6", root=tmp_path) == (dst, None)


def test_the_default_profile_ships_every_domains_base_policy():
    """Table 1's time budget on 2 cores assumes the small profile's base policies are shipped."""
    config = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    shipped_domains = {p.parent.name for p in _shipped_manifests() if p.parent.parent.name == config["profile"]}
    assert shipped_domains == set(config["domains"])
