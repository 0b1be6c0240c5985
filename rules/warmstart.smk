rule warmstart:
    """Expert SFT warm start per domain and seed (cached); its held-out score is Table 1's Vanilla."""
    output:
        f"{OUT}/warmstart/{{domain}}/seed{{seed}}/eval.json",
    log:
        f"{OUT}/logs/warmstart/{{domain}}/seed{{seed}}.log",
    params:
        job=lambda w: job_json(w.domain),
        out=lambda w: f"{OUT}/warmstart/{w.domain}/seed{w.seed}",
    wildcard_constraints:
        seed=r"\d+",
    threads: 1
    conda:
        "../envs/suite.yaml"
    shell:
        "python -m methods.cli warmstart --job {params.job} --seed {wildcards.seed} "
        "--out {params.out} --threads {threads} > {log} 2>&1"
