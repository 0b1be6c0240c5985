"""Publish a profile's report into the repository, stamped, so that a reader sees results without running anything.

    python -m analysis.publish --profile small --report results/small/report.md \\
        --tables results/small/table1.md results/small/table1.csv results/small/lopd_diagnosis.csv \\
        --dest docs/results/small --readme README.md

Copies the report into ``--dest`` with every figure it shows (``![..](path)``, copied
to ``figures/`` beside it and the link rewritten), the named tables, and writes
``STAMP.json``: the commit the runs' code came from, the profile and the digest of
its configuration (:func:`methods.core.config.profile_digest`).
``tests/test_published.py`` fails when that digest no longer matches the current
configuration, so stale results cannot pass for current ones.  With ``--readme``,
the block between ``<!-- results:<profile>:start -->`` and ``<!-- results:<profile>:end -->``
in README.md becomes the published Table 1 and the sample-efficiency figure.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
from datetime import UTC, datetime
from pathlib import Path

import yaml

from methods.core.config import profile_digest
from methods.core.provenance import git_commit, write_json_atomic, write_text_atomic

ROOT = Path(__file__).resolve().parents[1]
IMAGE = re.compile(r"!\[([^\]]*)\]\(([^)\s]+)\)")


def markers(profile: str) -> tuple[str, str]:
    return f"<!-- results:{profile}:start -->", f"<!-- results:{profile}:end -->"


def stamp(profile: str, config: dict) -> dict:
    return {
        "profile": profile,
        "config_digest": profile_digest(config, profile),
        "commit": git_commit()["commit"],
        "published": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def stale_reason(stamp: dict, config: dict) -> str | None:
    """Why a published stamp no longer describes the configuration (None: it does)."""
    now = profile_digest(config, stamp["profile"])
    if stamp["config_digest"] != now:
        return (
            f"the results published for profile {stamp['profile']} were made under configuration digest "
            f"{stamp['config_digest']}, and the configuration is now {now}: rerun "
            f"`snakemake --cores all docs/results/{stamp['profile']}/report.md` (or remove the stale results)"
        )
    return None


def copy_report(report: Path, dest: Path, header: str) -> str:
    """The report with its figures copied into ``dest/figures`` and their links rewritten."""
    text = report.read_text()
    figs = dest / "figures"

    def move(m: re.Match) -> str:
        src = (report.parent / m.group(2)).resolve()
        if not src.exists():
            raise FileNotFoundError(f"{report} shows {m.group(2)}, which does not exist")
        figs.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, figs / src.name)
        pdf = src.with_suffix(".pdf")
        if pdf.exists():
            shutil.copyfile(pdf, figs / pdf.name)
        return f"![{m.group(1)}](figures/{src.name})"

    body = IMAGE.sub(move, text)
    lines = body.splitlines()
    return "\n".join([lines[0], "", header, *lines[1:]]) + "\n"


def readme_block(profile: str, table1_md: str, figure: str | None) -> str:
    start, end = markers(profile)
    table = re.sub(r"^#+ (.*)$", r"**\1**", table1_md.strip(), flags=re.M)  # no headings inside README's section
    parts = [start, "", table, ""]
    if figure:
        parts += [f"![sample efficiency]({figure})", ""]
    return "\n".join([*parts, end])


def update_readme(readme: Path, profile: str, block: str) -> None:
    start, end = markers(profile)
    text = readme.read_text()
    if start not in text or end not in text:
        raise ValueError(f"{readme} has no {start} ... {end} block to fill")
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    write_text_atomic(readme, head + block + tail)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--profile", required=True)
    p.add_argument("--report", required=True, type=Path)
    p.add_argument("--tables", nargs="*", default=[], type=Path, help="tables copied beside the report")
    p.add_argument("--dest", required=True, type=Path)
    p.add_argument("--config", default=ROOT / "config" / "config.yaml", type=Path)
    p.add_argument("--readme", type=Path, help="README.md whose results block to fill")
    a = p.parse_args(argv)
    config = yaml.safe_load(a.config.read_text())
    st = stamp(a.profile, config)
    a.dest.mkdir(parents=True, exist_ok=True)
    header = (
        f"Published from the runs of profile `{a.profile}` at commit {st['commit'][:12]}, configuration digest "
        f"`{st['config_digest']}` (`STAMP.json`); `tests/test_published.py` fails once the configuration changes."
    )
    write_text_atomic(a.dest / "report.md", copy_report(a.report, a.dest, header))
    for t in a.tables:
        shutil.copyfile(t, a.dest / t.name)
    write_json_atomic(a.dest / "STAMP.json", st)
    if a.readme and markers(a.profile)[0] not in (a.readme.read_text() if a.readme.exists() else ""):
        print(f"note: {a.readme} has no results block for {a.profile}; left as it is")
    elif a.readme:
        table1 = a.dest / "table1.md"
        if not table1.exists():
            p.error("--readme needs table1.md among --tables")
        fig = a.dest / "figures" / "sample_efficiency.png"
        rel = os.path.relpath(fig, a.readme.parent) if fig.exists() else None
        update_readme(a.readme, a.profile, readme_block(a.profile, table1.read_text(), rel))
    print(f"published {a.profile} to {a.dest} (digest {st['config_digest']})")


if __name__ == "__main__":
    main()
