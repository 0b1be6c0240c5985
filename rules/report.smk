# The paper's figures and tables beyond Table 1, and the report that gathers them (all under results/<profile>/).
RUN_SUMMARIES = expand(
    f"{OUT}/runs/{{domain}}/{{method}}/seed{{seed}}/summary.json", domain=DOMAINS, method=METHODS, seed=SEEDS
)
VANILLA_EVALS = expand(f"{OUT}/warmstart/{{domain}}/eval.json", domain=DOMAINS)
BEHAVIOUR_DOMAIN = "tooluse"


rule sample_efficiency:
    """The paper's Fig. 4: held-out reward against student rollouts, every method, one column per domain (PNG + PDF)."""
    input:
        vanilla=VANILLA_EVALS,
        runs=RUN_SUMMARIES,
    output:
        png=report(f"{OUT}/figures/sample_efficiency.png", category="Figures", subcategory="sample efficiency"),
        pdf=f"{OUT}/figures/sample_efficiency.pdf",
    log:
        f"{OUT}/logs/sample_efficiency.log",
    conda:
        "../envs/suite.yaml"
    threads: 1
    shell:
        "python -m analysis.sample_efficiency --vanilla {input.vanilla} --runs {input.runs} --out {output.png} > {log} 2>&1"


rule rollouts_to_target:
    """Student rollouts at which each method first reaches the reference method's (GRPO's) final held-out score (bootstrap CI over seeds)."""
    input:
        runs=RUN_SUMMARIES,
    output:
        csv=report(f"{OUT}/rollouts_to_target.csv", category="Sample efficiency", subcategory="rollouts to target"),
        md=f"{OUT}/rollouts_to_target.md",
    log:
        f"{OUT}/logs/rollouts_to_target.log",
    conda:
        "../envs/suite.yaml"
    threads: 1
    params:
        reference=REFERENCE,
    shell:
        "python -m analysis.rollouts_to_target --runs {input.runs} --reference {params.reference} --out-csv {output.csv} --out-md {output.md} > {log} 2>&1"


rule improvement:
    """Probability of improvement of the focus method (LOPD) over every other method and Vanilla (stratified bootstrap CI)."""
    input:
        vanilla=VANILLA_EVALS,
        runs=RUN_SUMMARIES,
    output:
        csv=report(f"{OUT}/improvement.csv", category="Table 1", subcategory="probability of improvement"),
        md=f"{OUT}/improvement.md",
    log:
        f"{OUT}/logs/improvement.log",
    conda:
        "../envs/suite.yaml"
    threads: 1
    params:
        focus=FOCUS,
    shell:
        "python -m analysis.improvement --vanilla {input.vanilla} --runs {input.runs} --method {params.focus} --out-csv {output.csv} --out-md {output.md} > {log} 2>&1"


rule behaviour:
    """The paper's Table 3 on held-out tool-use tasks: steps, calls per step, repeated calls, reward per call, first response."""
    input:
        vanilla=[f"{OUT}/warmstart/{BEHAVIOUR_DOMAIN}/eval.json"],
        runs=expand(f"{OUT}/runs/{BEHAVIOUR_DOMAIN}/{{method}}/seed{{seed}}/summary.json", method=METHODS, seed=SEEDS),
    output:
        csv=report(f"{OUT}/behaviour.csv", category="Behaviour", subcategory="tool use"),
        md=f"{OUT}/behaviour.md",
    log:
        f"{OUT}/logs/behaviour.log",
    conda:
        "../envs/suite.yaml"
    threads: 1
    shell:
        "python -m analysis.behaviour --vanilla {input.vanilla} --runs {input.runs} --out-csv {output.csv} --out-md {output.md} > {log} 2>&1"


rule teacher_check:
    """Issue 3's sanity check per self-distillation run: what its own privileged context gives its teacher."""
    input:
        runs=RUN_SUMMARIES,
    output:
        csv=report(f"{OUT}/teacher_check.csv", category="Diagnostics", subcategory="teacher check"),
        md=f"{OUT}/teacher_check.md",
    log:
        f"{OUT}/logs/teacher_check.log",
    conda:
        "../envs/suite.yaml"
    threads: 1
    shell:
        "python -m analysis.teacher_check --runs {input.runs} --out-csv {output.csv} --out-md {output.md} > {log} 2>&1"


rule testbed_probe:
    """The base policy without context, with the task's reference solution and with retrieved experience (held-out tasks)."""
    input:
        ws=f"{OUT}/warmstart/{{domain}}/eval.json",
        bank=lambda w: [f"{OUT}/bank/{w.domain}/bank.pt"] if testbed_uses_bank(w.domain) else [],
        retrieved=lambda w: [f"{OUT}/bank/{w.domain}/eval_retrieved.json"] if testbed_uses_bank(w.domain) else [],
    output:
        f"{OUT}/testbed/{{domain}}/testbed.json",
    log:
        f"{OUT}/logs/testbed/{{domain}}.log",
    conda:
        "../envs/suite.yaml"
    threads: 1
    params:
        job=lambda w: shlex.quote(json.dumps(bank_job(config, w.domain), sort_keys=True)),
        ws=lambda w: f"{OUT}/warmstart/{w.domain}",
        bank=lambda w, input: f"--bank {input.bank} --retrieved-eval {input.retrieved}" if input.bank else "",
        n_retrieve=lambda w: testbed_n_retrieve(w.domain),
        seed=BASE_SEED,
    shell:
        "python -m methods.core.forkserver methods.cli testbed --job {params.job} --seed {params.seed} --warmstart {params.ws} {params.bank} "
        "--n-retrieve {params.n_retrieve} --out {output} --threads {threads} > {log} 2>&1"


rule testbed:
    """Test-bed validity per domain: transferable headroom, usable privileged information and experience, precise evaluations."""
    input:
        probes=expand(f"{OUT}/testbed/{{domain}}/testbed.json", domain=DOMAINS),
        vanilla=VANILLA_EVALS,
        runs=RUN_SUMMARIES,
    output:
        csv=report(f"{OUT}/testbed.csv", category="Test bed", subcategory="validity checks"),
        md=f"{OUT}/testbed.md",
    log:
        f"{OUT}/logs/testbed.log",
    conda:
        "../envs/suite.yaml"
    threads: 1
    shell:
        "python -m analysis.testbed --probes {input.probes} --vanilla {input.vanilla} --runs {input.runs} "
        "--out-csv {output.csv} --out-md {output.md} > {log} 2>&1"


rule paired:
    """Each method minus GRPO and minus Vanilla, same RL seed, mean and 95 % CI over seeds."""
    input:
        vanilla=VANILLA_EVALS,
        runs=RUN_SUMMARIES,
    output:
        csv=report(f"{OUT}/paired.csv", category="Table 1", subcategory="paired differences"),
        md=f"{OUT}/paired.md",
    log:
        f"{OUT}/logs/paired.log",
    conda:
        "../envs/suite.yaml"
    threads: 1
    shell:
        "python -m analysis.paired --vanilla {input.vanilla} --runs {input.runs} --out-csv {output.csv} --out-md {output.md} > {log} 2>&1"


rule compute:
    """The compute-matched view: held-out reward against each run's training wall time and token passes (table + figure)."""
    input:
        runs=RUN_SUMMARIES,
    output:
        csv=report(f"{OUT}/compute.csv", category="Compute", subcategory="reward against compute"),
        md=f"{OUT}/compute.md",
        png=report(f"{OUT}/figures/compute.png", category="Compute", subcategory="figure"),
    log:
        f"{OUT}/logs/compute.log",
    conda:
        "../envs/suite.yaml"
    threads: 1
    shell:
        "python -m analysis.compute --runs {input.runs} --out-csv {output.csv} --out-md {output.md} --out-png {output.png} > {log} 2>&1"


rule report:
    """The report (results/<profile>/report.md): test-bed validity first, then Table 1, paired differences, figures, rollouts-to-target, probability of improvement, ablations, behaviour, LOPD's diagnosis and dynamics."""
    input:
        table1=f"{OUT}/table1.csv",
        table1_md=f"{OUT}/table1.md",
        targets=f"{OUT}/rollouts_to_target.csv",
        targets_md=f"{OUT}/rollouts_to_target.md",
        improvement=f"{OUT}/improvement.csv",
        improvement_md=f"{OUT}/improvement.md",
        ablations=f"{OUT}/ablations.csv",
        ablations_md=f"{OUT}/ablations.md",
        behaviour_md=[f"{OUT}/behaviour.md"] if BEHAVIOUR_DOMAIN in DOMAINS else [],
        dynamics=f"{OUT}/lopd_dynamics.csv",
        diagnosis=f"{OUT}/lopd_diagnosis.csv",
        diagnosis_md=f"{OUT}/lopd_diagnosis.md",
        figure=f"{OUT}/figures/sample_efficiency.png",
        dynamics_figure=f"{OUT}/lopd_dynamics.png",
        teacher_check=f"{OUT}/teacher_check.csv",
        teacher_check_md=f"{OUT}/teacher_check.md",
        warmstarts=VANILLA_EVALS,
        testbed=f"{OUT}/testbed.csv",
        testbed_md=f"{OUT}/testbed.md",
        paired_md=f"{OUT}/paired.md",
        compute_md=f"{OUT}/compute.md",
        compute_png=f"{OUT}/figures/compute.png",
    output:
        f"{OUT}/report.md",
    log:
        f"{OUT}/logs/report.log",
    conda:
        "../envs/suite.yaml"
    threads: 1
    params:
        behaviour=lambda w, input: f"--behaviour-md {input.behaviour_md}" if input.behaviour_md else "",
    shell:
        "python -m analysis.report --table1 {input.table1} --table1-md {input.table1_md} "
        "--targets {input.targets} --targets-md {input.targets_md} --improvement {input.improvement} --improvement-md {input.improvement_md} "
        "--ablations {input.ablations} --ablations-md {input.ablations_md} {params.behaviour} --dynamics {input.dynamics} "
        "--diagnosis {input.diagnosis} --diagnosis-md {input.diagnosis_md} "
        "--figure {input.figure} --dynamics-figure {input.dynamics_figure} "
        "--teacher-check {input.teacher_check} --teacher-check-md {input.teacher_check_md} --warmstarts {input.warmstarts} "
        "--testbed {input.testbed} --testbed-md {input.testbed_md} --paired-md {input.paired_md} "
        "--compute-md {input.compute_md} --compute-figure {input.compute_png} --out {output} > {log} 2>&1"


rule publish:
    """The profile's report with its figures and main tables, kept in the repository (docs/results/<profile>/) and stamped with the commit and the configuration's digest (analysis/publish.py); for the headline profile also README's Results block."""
    input:
        report=f"{OUT}/report.md",
        tables=[
            f"{OUT}/{t}"
            for t in (
                "table1.md",
                "table1.csv",
                "paired.md",
                "ablations.md",
                "ablations.csv",
                "lopd_diagnosis.md",
                "lopd_diagnosis.csv",
                "compute.md",
                "testbed.md",
            )
        ],
    output:
        report=f"docs/results/{PROFILE}/report.md",
        stamp=f"docs/results/{PROFILE}/STAMP.json",
    log:
        f"{OUT}/logs/publish.log",
    conda:
        "../envs/suite.yaml"
    threads: 1
    params:
        profile=PROFILE,
        dest=lambda w, output: os.path.dirname(output.stamp),
        readme="--readme README.md" if PROFILE == HEADLINE else "",
    shell:
        "python -m analysis.publish --profile {params.profile} --report {input.report} --tables {input.tables} "
        "--dest {params.dest} {params.readme} > {log} 2>&1"
