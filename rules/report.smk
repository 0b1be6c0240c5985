# The paper's figures and tables beyond Table 1, and results/report.md that gathers them.
RUN_SUMMARIES = expand(f"{OUT}/runs/{{domain}}/{{method}}/seed{{seed}}/summary.json", domain=DOMAINS, method=METHODS, seed=SEEDS)
VANILLA_EVALS = expand(f"{OUT}/warmstart/{{domain}}/seed{{seed}}/eval.json", domain=DOMAINS, seed=SEEDS)
BEHAVIOUR_DOMAIN = "tooluse"


rule sample_efficiency:
    """The paper's Fig. 4: held-out reward against student rollouts, every method, one column per domain (PNG + PDF)."""
    input:
        vanilla=VANILLA_EVALS,
        runs=RUN_SUMMARIES,
    output:
        png="results/figures/sample_efficiency.png",
        pdf="results/figures/sample_efficiency.pdf",
    log:
        "results/logs/sample_efficiency.log",
    threads: 1
    conda:
        "../envs/suite.yaml"
    shell:
        "python -m analysis.sample_efficiency --vanilla {input.vanilla} --runs {input.runs} --out {output.png} > {log} 2>&1"


rule rollouts_to_target:
    """Student rollouts at which each method first reaches GRPO's final held-out score (bootstrap CI over seeds)."""
    input:
        runs=RUN_SUMMARIES,
    output:
        csv="results/rollouts_to_target.csv",
        md="results/rollouts_to_target.md",
    log:
        "results/logs/rollouts_to_target.log",
    threads: 1
    conda:
        "../envs/suite.yaml"
    shell:
        "python -m analysis.rollouts_to_target --runs {input.runs} --reference grpo --out-csv {output.csv} --out-md {output.md} > {log} 2>&1"


rule improvement:
    """Probability of improvement of LOPD over every other method and Vanilla (stratified bootstrap CI)."""
    input:
        vanilla=VANILLA_EVALS,
        runs=RUN_SUMMARIES,
    output:
        csv="results/improvement.csv",
        md="results/improvement.md",
    log:
        "results/logs/improvement.log",
    threads: 1
    conda:
        "../envs/suite.yaml"
    shell:
        "python -m analysis.improvement --vanilla {input.vanilla} --runs {input.runs} --method lopd --out-csv {output.csv} --out-md {output.md} > {log} 2>&1"


rule behaviour:
    """The paper's Table 3 on held-out tool-use tasks: steps, calls per step, repeated calls, reward per call, first response."""
    input:
        vanilla=expand(f"{OUT}/warmstart/{BEHAVIOUR_DOMAIN}/seed{{seed}}/eval.json", seed=SEEDS),
        runs=expand(f"{OUT}/runs/{BEHAVIOUR_DOMAIN}/{{method}}/seed{{seed}}/summary.json", method=METHODS, seed=SEEDS),
    output:
        csv="results/behaviour.csv",
        md="results/behaviour.md",
    log:
        "results/logs/behaviour.log",
    threads: 1
    conda:
        "../envs/suite.yaml"
    shell:
        "python -m analysis.behaviour --vanilla {input.vanilla} --runs {input.runs} --out-csv {output.csv} --out-md {output.md} > {log} 2>&1"


rule teacher_check:
    """Issue 3's sanity check per self-distillation run: what its own privileged context gives its teacher."""
    input:
        runs=RUN_SUMMARIES,
    output:
        csv="results/teacher_check.csv",
        md="results/teacher_check.md",
    log:
        "results/logs/teacher_check.log",
    threads: 1
    conda:
        "../envs/suite.yaml"
    shell:
        "python -m analysis.teacher_check --runs {input.runs} --out-csv {output.csv} --out-md {output.md} > {log} 2>&1"


rule report:
    """results/report.md: Table 1, figures, rollouts-to-target, probability of improvement, ablations, behaviour, dynamics."""
    input:
        table1="results/table1.csv",
        table1_md="results/table1.md",
        targets="results/rollouts_to_target.csv",
        targets_md="results/rollouts_to_target.md",
        improvement="results/improvement.csv",
        improvement_md="results/improvement.md",
        ablations="results/ablations.csv",
        ablations_md="results/ablations.md",
        behaviour_md=["results/behaviour.md"] if BEHAVIOUR_DOMAIN in DOMAINS else [],
        dynamics="results/lopd_dynamics.csv",
        figure="results/figures/sample_efficiency.png",
        dynamics_figure="results/lopd_dynamics.png",
        teacher_check="results/teacher_check.csv",
        teacher_check_md="results/teacher_check.md",
        warmstarts=VANILLA_EVALS,
    output:
        "results/report.md",
    log:
        "results/logs/report.log",
    params:
        behaviour=lambda w, input: f"--behaviour-md {input.behaviour_md}" if input.behaviour_md else "",
    threads: 1
    conda:
        "../envs/suite.yaml"
    shell:
        "python -m analysis.report --table1 {input.table1} --table1-md {input.table1_md} "
        "--targets {input.targets} --targets-md {input.targets_md} --improvement {input.improvement} --improvement-md {input.improvement_md} "
        "--ablations {input.ablations} --ablations-md {input.ablations_md} {params.behaviour} --dynamics {input.dynamics} "
        "--figure {input.figure} --dynamics-figure {input.dynamics_figure} "
        "--teacher-check {input.teacher_check} --teacher-check-md {input.teacher_check_md} --warmstarts {input.warmstarts} --out {output} > {log} 2>&1"
