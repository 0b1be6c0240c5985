# One base policy per domain (the paper's setting: every method and every RL seed starts from
# the same pretrained model).  Built once with the profile's base_seed; RL seeds vary the runs only.
rule warmstart_stage1:
    """Expert SFT warm start per domain (cached); its job never holds the on-policy stage's fields.
    With model.checkpoint (a real model, e.g. results/models/<name> from rule pretrained_model) the
    checkpoint is the warm start, and this job evaluates it."""
    input:
        lambda w: [c] if (c := job_of(w.domain)["model"]["checkpoint"]) else [],
    output:
        f"{OUT}/warmstart_stage1/{{domain}}/eval.json",
    log:
        f"{OUT}/logs/warmstart_stage1/{{domain}}.log",
    conda:
        "../envs/suite.yaml"
    threads: 1
    params:
        seed=BASE_SEED,
        job=lambda w: job_json(w.domain, stage1=True),
        out=lambda w: f"{OUT}/warmstart_stage1/{w.domain}",
    shell:
        "python -m methods.core.forkserver methods.cli warmstart --job {params.job} --seed {params.seed} "
        "--out {params.out} --threads {threads} > {log} 2>&1"


rule warmstart:
    """The base policy every method and seed of a domain starts from: stage 1's, continued by
    the on-policy stage when warmstart.onpolicy_steps > 0; its held-out score is Table 1's Vanilla.
    A base policy shipped in results/base/<profile>/<domain>/ is installed instead of trained when
    its manifest records exactly this job, seed and task version (methods/stages/shipped.py)."""
    input:
        lambda w: (
            [f"{shipped_base(w.domain)}/manifest.json"]
            if shipped_base(w.domain)
            else [f"{OUT}/warmstart_stage1/{w.domain}/eval.json"]
        ),
    output:
        f"{OUT}/warmstart/{{domain}}/eval.json",
    log:
        f"{OUT}/logs/warmstart/{{domain}}.log",
    conda:
        "../envs/suite.yaml"
    threads: 1
    params:
        seed=BASE_SEED,
        job=lambda w: job_json(w.domain),
        source=lambda w: (
            f"install-base --shipped {shipped_base(w.domain)}"
            if shipped_base(w.domain)
            else f"warmstart-stage2 --stage1 {OUT}/warmstart_stage1/{w.domain}"
        ),
        out=lambda w: f"{OUT}/warmstart/{w.domain}",
    shell:
        "python -m methods.core.forkserver methods.cli {params.source} --job {params.job} --seed {params.seed} "
        "--out {params.out} --threads {threads} > {log} 2>&1"


rule base_rebuild:
    """Train the base policy from scratch, as if none were shipped, and compare it file by file
    with the shipped one (check.json: bit_identical).  To ship a new one after a settings change:
    python -m methods.cli ship-base --job ... --seed ... --warmstart <this dir> --out results/base/<profile>/<domain>.
    """
    input:
        f"{OUT}/warmstart_stage1/{{domain}}/eval.json",
    output:
        f"{OUT}/base_rebuild/{{domain}}/check.json",
    log:
        f"{OUT}/logs/base_rebuild/{{domain}}.log",
    conda:
        "../envs/suite.yaml"
    threads: 1
    params:
        seed=BASE_SEED,
        job=lambda w: job_json(w.domain),
        stage1=lambda w: f"{OUT}/warmstart_stage1/{w.domain}",
        out=lambda w: f"{OUT}/base_rebuild/{w.domain}",
        shipped=lambda w: shipped_path(w.domain),
    shell:
        "(python -m methods.core.forkserver methods.cli warmstart-stage2 --job {params.job} --seed {params.seed} --stage1 {params.stage1} "
        "--out {params.out} --threads {threads} && "
        "python -m methods.core.forkserver methods.cli check-base --job {params.job} --seed {params.seed} --warmstart {params.out} "
        "--shipped {params.shipped} --out {output}) > {log} 2>&1"
