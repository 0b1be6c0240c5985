rule table1:
    """Table 1: held-out reward per (domain, method), mean and 95 % bootstrap CI over seeds."""
    input:
        vanilla=expand(f"{OUT}/warmstart/{{domain}}/eval.json", domain=DOMAINS),
        runs=expand(
            f"{OUT}/runs/{{domain}}/{{method}}/seed{{seed}}/summary.json", domain=DOMAINS, method=METHODS, seed=SEEDS
        ),
    output:
        csv=report(f"{OUT}/table1.csv", category="Table 1", subcategory="held-out reward"),
        md=f"{OUT}/table1.md",
        curves=f"{OUT}/curves.csv",
    log:
        f"{OUT}/logs/table1.log",
    conda:
        "../envs/suite.yaml"
    threads: 1
    shell:
        "python -m analysis.table1 --vanilla {input.vanilla} --runs {input.runs} "
        "--out-csv {output.csv} --out-md {output.md} --out-curves {output.curves} > {log} 2>&1"
