rule bank:
    """Seed a domain's experience bank with the warm-start policy's own successes on training tasks (cached per seed)."""
    input:
        f"{OUT}/warmstart/{{domain}}/seed{{seed}}/eval.json",
    output:
        bank=f"{OUT}/bank/{{domain}}/seed{{seed}}/bank.pt",
        report=f"{OUT}/bank/{{domain}}/seed{{seed}}/bank.json",
    log:
        f"{OUT}/logs/bank/{{domain}}/seed{{seed}}.log",
    params:
        job=lambda w: shlex.quote(json.dumps(bank_job(config, w.domain), sort_keys=True)),
        ws=lambda w: f"{OUT}/warmstart/{w.domain}/seed{w.seed}",
        out=lambda w: f"{OUT}/bank/{w.domain}/seed{w.seed}",
    wildcard_constraints:
        seed=r"\d+",
    threads: 1
    conda:
        "../envs/suite.yaml"
    shell:
        "python -m methods.cli bank --job {params.job} --seed {wildcards.seed} "
        "--warmstart {params.ws} --out {params.out} --threads {threads} > {log} 2>&1"
