# LOPD benchmark suite: the table of contents.
#   snakemake --cores all results/table1.csv          (the headline profile's Table 1; results/small/table1.csv)
#   snakemake --cores all results/report.md           (every table and figure, from the same runs)
#   snakemake --cores all results/smoke/report.md --config profile=smoke   (any profile, under results/<profile>/)
from snakemake.utils import min_version, validate

min_version("9.0")


configfile: "config/config.yaml"


validate(config, "config/schema.yaml")


report: "docs/report-workflow.rst"


include: "rules/common.smk"
include: "rules/warmstart.smk"
include: "rules/bank.smk"
include: "rules/train.smk"
include: "rules/verl.smk"
include: "rules/focus.smk"
include: "rules/table1.smk"
include: "rules/report.smk"
include: "rules/headline.smk"
include: "rules/models.smk"


rule all:
    input:
        f"{OUT}/table1.csv",
        ["results/table1.csv"] if PROFILE == HEADLINE else [],
