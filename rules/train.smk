if BACKEND == "suite":  # a verl profile trains its runs with rules/verl.smk instead

    rule train:
        """One method (or ablation variant) on one domain and seed, from the domain's base policy; the seed varies the RL only (resumes from its checkpoint)."""
        input:
            ws=f"{OUT}/warmstart/{{domain}}/eval.json",
            bank=lambda w: [f"{OUT}/bank/{w.domain}/bank.pt"] if uses_bank(config, w.method) else [],
            composer=lambda w: coldstart_path(w.domain, w.method, w.seed),
            reuse=lambda w: [f"{OUT}/bank/{w.domain}/eval_retrieved.json"] if uses_bank(config, w.method) else [],
        output:
            f"{OUT}/runs/{{domain}}/{{method}}/seed{{seed}}/summary.json",
        log:
            f"{OUT}/logs/train/{{domain}}/{{method}}/seed{{seed}}.log",
        wildcard_constraints:
            seed=r"\d+",
        conda:
            "../envs/suite.yaml"
        threads: 1
        params:
            job=lambda w: job_json(w.domain, w.method),
            ws=lambda w: f"{OUT}/warmstart/{w.domain}",
            out=lambda w: f"{OUT}/runs/{w.domain}/{w.method}/seed{w.seed}",
            bank=lambda w: f"--bank {OUT}/bank/{w.domain}/bank.pt" if uses_bank(config, w.method) else "",
            composer=lambda w: " ".join(f"--composer {p}" for p in coldstart_path(w.domain, w.method, w.seed)),
            reuse=lambda w, input: " ".join(f"--context-eval {p}" for p in input.reuse),
        shell:
            "python -m methods.core.forkserver methods.cli train --job {params.job} --seed {wildcards.seed} "
            "--warmstart {params.ws} {params.bank} {params.composer} {params.reuse} --out {params.out} --threads {threads} > {log} 2>&1"
