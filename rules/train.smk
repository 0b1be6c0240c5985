rule train:
    """One method on one domain and seed, from that seed's warm start (resumes from its checkpoint)."""
    input:
        f"{OUT}/warmstart/{{domain}}/seed{{seed}}/eval.json",
    output:
        f"{OUT}/runs/{{domain}}/{{method}}/seed{{seed}}/summary.json",
    log:
        f"{OUT}/logs/train/{{domain}}/{{method}}/seed{{seed}}.log",
    params:
        job=lambda w: job_json(w.domain, w.method),
        ws=lambda w: f"{OUT}/warmstart/{w.domain}/seed{w.seed}",
        out=lambda w: f"{OUT}/runs/{w.domain}/{w.method}/seed{w.seed}",
    wildcard_constraints:
        seed=r"\d+",
    threads: 1
    conda:
        "../envs/suite.yaml"
    shell:
        "python -m methods.cli train --job {params.job} --seed {wildcards.seed} "
        "--warmstart {params.ws} --out {params.out} --threads {threads} > {log} 2>&1"
