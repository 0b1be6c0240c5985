# The focus method's rules (focus_method in config/config.yaml: LOPD): its cold start, its ablations, and
# the dynamics and diagnosis of its runs.
rule coldstart:
    """LOPD: cold-start the composer (LoRA + Q-Former) on the warm start's own successes (per domain, RL seed and K/J, from the domain's base policy and bank)."""
    input:
        ws=f"{OUT}/warmstart/{{domain}}/eval.json",
        bank=f"{OUT}/bank/{{domain}}/bank.pt",
    output:
        composer=f"{OUT}/coldstart/{{domain}}/{{key}}/seed{{seed}}/composer.pt",
        report=f"{OUT}/coldstart/{{domain}}/{{key}}/seed{{seed}}/coldstart.json",
    log:
        f"{OUT}/logs/coldstart/{{domain}}/{{key}}/seed{{seed}}.log",
    wildcard_constraints:
        seed=r"\d+",
    conda:
        "../envs/suite.yaml"
    threads: 1
    params:
        job=lambda w: coldstart_job(w.domain, w.key),
        ws=lambda w: f"{OUT}/warmstart/{w.domain}",
        out=lambda w: f"{OUT}/coldstart/{w.domain}/{w.key}/seed{w.seed}",
    shell:
        "python -m methods.core.forkserver methods.cli coldstart --job {params.job} --seed {wildcards.seed} "
        "--warmstart {params.ws} --bank {input.bank} --out {params.out} --threads {threads} > {log} 2>&1"


rule ablations:
    """The paper's LOPD ablations (config/config.yaml, ablations:) beside LOPD itself, same long format as Table 1."""
    input:
        runs=expand(
            f"{OUT}/runs/{{domain}}/{{method}}/seed{{seed}}/summary.json",
            domain=ABLATION_DOMAINS,
            method=[FOCUS] + ABLATIONS,
            seed=SEEDS,
        ),
    output:
        csv=report(f"{OUT}/ablations.csv", category="Ablations", subcategory="LOPD variants"),
        md=f"{OUT}/ablations.md",
        curves=f"{OUT}/ablation_curves.csv",
    log:
        f"{OUT}/logs/ablations.log",
    conda:
        "../envs/suite.yaml"
    threads: 1
    shell:
        "python -m analysis.table1 --runs {input.runs} --title 'LOPD ablations' "
        "--out-csv {output.csv} --out-md {output.md} --out-curves {output.curves} > {log} 2>&1"


rule lopd_dynamics:
    """β, Δ, the composer's KL and the anchor over training, for LOPD and its variants (CSV + figure)."""
    input:
        runs=expand(f"{OUT}/runs/{{domain}}/{FOCUS}/seed{{seed}}/summary.json", domain=DOMAINS, seed=SEEDS)
        + expand(
            f"{OUT}/runs/{{domain}}/{{method}}/seed{{seed}}/summary.json",
            domain=ABLATION_DOMAINS,
            method=ABLATIONS,
            seed=SEEDS,
        ),
    output:
        csv=f"{OUT}/lopd_dynamics.csv",
        png=report(f"{OUT}/lopd_dynamics.png", category="Diagnostics", subcategory="LOPD dynamics"),
    log:
        f"{OUT}/logs/lopd_dynamics.log",
    conda:
        "../envs/suite.yaml"
    threads: 1
    params:
        metrics=lambda w, input: " ".join(p.replace("summary.json", "metrics.jsonl") for p in input.runs),
    shell:
        "python -m analysis.lopd_dynamics --runs {params.metrics} --out-csv {output.csv} --out-png {output.png} > {log} 2>&1"


rule lopd_diagnosis:
    """Where LOPD lands and why (analysis/lopd_diagnosis.py): cold-start gains, signal share, the teacher's advantage on successes and failures, β and Δ, the teacher against the student, per domain and variant over seeds."""
    input:
        runs=expand(f"{OUT}/runs/{{domain}}/{FOCUS}/seed{{seed}}/summary.json", domain=DOMAINS, seed=SEEDS)
        + expand(
            f"{OUT}/runs/{{domain}}/{{method}}/seed{{seed}}/summary.json",
            domain=ABLATION_DOMAINS,
            method=ABLATIONS,
            seed=SEEDS,
        ),
    output:
        csv=report(f"{OUT}/lopd_diagnosis.csv", category="Diagnostics", subcategory="LOPD diagnosis"),
        md=f"{OUT}/lopd_diagnosis.md",
    log:
        f"{OUT}/logs/lopd_diagnosis.log",
    conda:
        "../envs/suite.yaml"
    threads: 1
    shell:
        "python -m analysis.lopd_diagnosis --runs {input.runs} --out-csv {output.csv} --out-md {output.md} > {log} 2>&1"


if profile_section(config).get("compare_profile"):
    COMPARE = profile_section(config)["compare_profile"]

    rule scale_probe:
        """LOPD and its variants of this profile beside the same runs of compare_profile (the scale probe: the latent-against-text gap at both sizes); that profile's runs must exist (run it first)."""
        input:
            runs=rules.lopd_diagnosis.input.runs,
            other=expand(
                f"results/{COMPARE}/runs/{{domain}}/{{method}}/seed{{seed}}/summary.json",
                domain=ABLATION_DOMAINS,
                method=[FOCUS] + ABLATIONS,
                seed=SEEDS,
            ),
        output:
            csv=f"{OUT}/scale_probe.csv",
            md=report(f"{OUT}/scale_probe.md", category="Diagnostics", subcategory="Scale probe"),
        log:
            f"{OUT}/logs/scale_probe.log",
        conda:
            "../envs/suite.yaml"
        threads: 1
        shell:
            "python -m analysis.lopd_diagnosis --runs {input.other} {input.runs} --out-csv {output.csv} --out-md {output.md} > {log} 2>&1"
