rule bank:
    """Seed a domain's experience bank with the base policy's own successes on training tasks (one per domain)."""
    input:
        f"{OUT}/warmstart/{{domain}}/eval.json",
    output:
        bank=f"{OUT}/bank/{{domain}}/bank.pt",
        report=f"{OUT}/bank/{{domain}}/bank.json",
    log:
        f"{OUT}/logs/bank/{{domain}}.log",
    conda:
        "../envs/suite.yaml"
    threads: 1
    params:
        seed=BASE_SEED,
        job=lambda w: shlex.quote(json.dumps(bank_job(config, w.domain), sort_keys=True)),
        ws=lambda w: f"{OUT}/warmstart/{w.domain}",
        out=lambda w: f"{OUT}/bank/{w.domain}",
    shell:
        "python -m methods.core.forkserver methods.cli bank --job {params.job} --seed {params.seed} "
        "--warmstart {params.ws} --out {params.out} --threads {threads} > {log} 2>&1"


rule retrieved_eval:
    """The base policy's held-out evaluation with the top-n retrieved experiences of the seeded bank in
    context: retrieval RL's evaluation at rollout 0 (the same for every seed, so its runs reuse it)
    and the test bed's experience check."""
    input:
        ws=f"{OUT}/warmstart/{{domain}}/eval.json",
        bank=f"{OUT}/bank/{{domain}}/bank.pt",
    output:
        f"{OUT}/bank/{{domain}}/eval_retrieved.json",
    log:
        f"{OUT}/logs/retrieved_eval/{{domain}}.log",
    conda:
        "../envs/suite.yaml"
    threads: 1
    params:
        seed=BASE_SEED,
        job=lambda w: shlex.quote(json.dumps(bank_job(config, w.domain), sort_keys=True)),
        ws=lambda w: f"{OUT}/warmstart/{w.domain}",
        n_retrieve=lambda w: testbed_n_retrieve(w.domain),
    shell:
        "python -m methods.core.forkserver methods.cli retrieved-eval --job {params.job} --seed {params.seed} --warmstart {params.ws} "
        "--bank {input.bank} --n-retrieve {params.n_retrieve} --out {output} --threads {threads} > {log} 2>&1"
