# results/table1.{csv,md} and results/report.md: the headline profile's tables, where a user looks
# first.  Every profile's own outputs stay under results/<profile>/, so a smoke run never
# overwrites the small profile's table.
if PROFILE == HEADLINE:

    rule headline_table1:
        """Table 1 of the headline profile, copied to results/."""
        input:
            csv=f"{OUT}/table1.csv",
            md=f"{OUT}/table1.md",
        output:
            csv="results/table1.csv",
            md="results/table1.md",
        log:
            f"{OUT}/logs/headline_table1.log",
        conda:
            "../envs/suite.yaml"
        shell:
            "(cp {input.csv} {output.csv} && cp {input.md} {output.md}) > {log} 2>&1"

    use rule report as headline_report with:
        output:
            "results/report.md",
        log:
            f"{OUT}/logs/headline_report.log",

else:

    rule headline_elsewhere:
        """results/table1.* and results/report.md show the headline profile: say where this profile's are."""
        output:
            "results/table1.csv",
            "results/table1.md",
            "results/report.md",
        log:
            f"{OUT}/logs/headline_elsewhere.log",
        conda:
            "../envs/suite.yaml"
        shell:
            f"echo 'results/table1.csv and results/report.md show the {HEADLINE} profile (headline_profile); "
            f"this run'\"'\"'s profile is {PROFILE}: ask for {OUT}/table1.csv or {OUT}/report.md' | tee {{log}} >&2; exit 1"
