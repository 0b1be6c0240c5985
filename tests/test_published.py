"""Published results (docs/results/<profile>/, written by the ``publish`` rule) must describe the
current configuration: a stamp whose configuration digest no longer matches fails here."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml

from analysis.publish import main as publish
from analysis.publish import markers, stale_reason, stamp

ROOT = Path(__file__).resolve().parents[1]
CONFIG = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
STAMPS = sorted((ROOT / "docs" / "results").glob("*/STAMP.json"))


@pytest.mark.parametrize("path", STAMPS or [None], ids=[p.parent.name for p in STAMPS] or ["none"])
def test_published_results_match_the_current_configuration(path):
    if path is None:
        pytest.skip("no results published yet (`snakemake --cores all docs/results/small/report.md` publishes them)")
    st = json.loads(path.read_text())
    reason = stale_reason(st, CONFIG)
    assert reason is None, reason
    assert (path.parent / "report.md").exists()
    start, end = markers(st["profile"])
    readme = (ROOT / "README.md").read_text()
    if st["profile"] == CONFIG.get("headline_profile") and start in readme:
        block = readme.split(start, 1)[1].split(end, 1)[0]
        rows = [ln for ln in (path.parent / "table1.md").read_text().splitlines() if ln.startswith("|")]
        assert rows and all(r in block for r in rows), "README's results block is not the published Table 1"


@pytest.mark.parametrize(
    "change, small_only",
    [
        (lambda c: c["profiles"]["small"]["train"].__setitem__("lr", 1e-4), True),
        (lambda c: c["profiles"]["small"].__setitem__("seeds", [0, 1]), True),
        (lambda c: c["profiles"]["small"]["method_overrides"]["lopd"].__setitem__("cold_start_steps", 7), True),
        (lambda c: c["profiles"]["small"]["bank"].__setitem__("seed_attempts", 1), True),
        (lambda c: c["ablations"].__setitem__("lopd_m020", {"method": "lopd", "margin": 0.2}), False),
        (lambda c: c["methods"].__setitem__("sdpo", {"ema_rate": 0.5}), False),
    ],
    ids=["train-lr", "seeds", "cold-start", "bank", "new-ablation", "method-override"],
)
def test_a_configuration_change_makes_published_results_stale(change, small_only):
    st = stamp("small", CONFIG)
    assert stale_reason(st, CONFIG) is None
    changed = copy.deepcopy(CONFIG)
    change(changed)
    reason = stale_reason(st, changed)
    assert reason is not None and "rerun" in reason
    if small_only:  # a change inside one profile leaves another profile's results current
        assert stale_reason(stamp("smoke", CONFIG), changed) is None


def test_publish_copies_figures_rewrites_links_stamps_and_fills_readme(tmp_path):
    res = tmp_path / "results" / "small"
    (res / "figures").mkdir(parents=True)
    (res / "figures" / "sample_efficiency.png").write_bytes(b"png")
    (res / "figures" / "sample_efficiency.pdf").write_bytes(b"pdf")
    (res / "report.md").write_text(
        "# LOPD benchmark: report\n\ntext\n\n![sample efficiency](figures/sample_efficiency.png)\n"
    )
    (res / "table1.md").write_text("# Table 1: held-out reward\n\n| domain | method |\n|---|---|\n| code | grpo |\n")
    start, end = markers("small")
    readme = tmp_path / "README.md"
    readme.write_text(f"# Suite\n\n## Results\n\n{start}\nnot yet\n{end}\n\n## Next\n")
    dest = tmp_path / "docs" / "results" / "small"
    publish(
        [
            "--profile", "small", "--report", str(res / "report.md"), "--tables", str(res / "table1.md"),
            "--dest", str(dest), "--readme", str(readme),
        ]
    )  # fmt: skip
    text = (dest / "report.md").read_text()
    assert "](figures/sample_efficiency.png)" in text and "configuration digest" in text
    assert (dest / "figures" / "sample_efficiency.png").read_bytes() == b"png"
    assert (dest / "figures" / "sample_efficiency.pdf").exists()
    st = json.loads((dest / "STAMP.json").read_text())
    assert st["profile"] == "small" and stale_reason(st, CONFIG) is None
    new = readme.read_text()
    assert "not yet" not in new and "| code | grpo |" in new and "**Table 1: held-out reward**" in new
    assert "docs/results/small/figures/sample_efficiency.png" in new and new.endswith("## Next\n")
    with pytest.raises(FileNotFoundError):
        (res / "report.md").write_text("# r\n\n![gone](figures/missing.png)\n")
        publish(["--profile", "small", "--report", str(res / "report.md"), "--dest", str(tmp_path / "x")])
