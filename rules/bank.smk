rule bank:
    """Seed a domain's experience bank with the base policy's own successes on training tasks (one per domain)."""
    input:
        f"{OUT}/warmstart/{{domain}}/eval.json",
    output:
        bank=f"{OUT}/bank/{{domain}}/bank.pt",
        report=f"{OUT}/bank/{{domain}}/bank.json",
    log:
        f"{OUT}/logs/bank/{{domain}}.log",
    params:
        seed=BASE_SEED,
        job=lambda w: shlex.quote(json.dumps(bank_job(config, w.domain), sort_keys=True)),
        ws=lambda w: f"{OUT}/warmstart/{w.domain}",
        out=lambda w: f"{OUT}/bank/{w.domain}",
    threads: 1
    conda:
        "../envs/suite.yaml"
    shell:
        "python -m methods.cli bank --job {params.job} --seed {params.seed} "
        "--warmstart {params.ws} --out {params.out} --threads {threads} > {log} 2>&1"
