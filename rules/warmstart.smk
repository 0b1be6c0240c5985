rule warmstart_stage1:
    """Expert SFT warm start per domain and seed (cached); its job never holds the on-policy stage's fields."""
    output:
        f"{OUT}/warmstart_stage1/{{domain}}/seed{{seed}}/eval.json",
    log:
        f"{OUT}/logs/warmstart_stage1/{{domain}}/seed{{seed}}.log",
    params:
        job=lambda w: job_json(w.domain, stage1=True),
        out=lambda w: f"{OUT}/warmstart_stage1/{w.domain}/seed{w.seed}",
    wildcard_constraints:
        seed=r"\d+",
    threads: 1
    conda:
        "../envs/suite.yaml"
    shell:
        "python -m methods.cli warmstart --job {params.job} --seed {wildcards.seed} "
        "--out {params.out} --threads {threads} > {log} 2>&1"


rule warmstart:
    """The warm start every method starts from: stage 1's, continued by the on-policy stage
    when warmstart.onpolicy_steps > 0; its held-out score is Table 1's Vanilla."""
    input:
        f"{OUT}/warmstart_stage1/{{domain}}/seed{{seed}}/eval.json",
    output:
        f"{OUT}/warmstart/{{domain}}/seed{{seed}}/eval.json",
    log:
        f"{OUT}/logs/warmstart/{{domain}}/seed{{seed}}.log",
    params:
        job=lambda w: job_json(w.domain),
        stage1=lambda w: f"{OUT}/warmstart_stage1/{w.domain}/seed{w.seed}",
        out=lambda w: f"{OUT}/warmstart/{w.domain}/seed{w.seed}",
    wildcard_constraints:
        seed=r"\d+",
    threads: 1
    conda:
        "../envs/suite.yaml"
    shell:
        "python -m methods.cli warmstart-stage2 --job {params.job} --seed {wildcards.seed} --stage1 {params.stage1} "
        "--out {params.out} --threads {threads} > {log} 2>&1"
