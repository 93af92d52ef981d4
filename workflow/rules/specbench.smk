# Spec-Bench's leaderboard: every cell's decode file read as Spec-Bench's evaluation/speed.py reads
# answer files (speed-up over plain decoding, #mean accepted tokens, per category), with the lossless
# counts against `auto` and the quality of the categories that have references; the answer files
# themselves are written beside it, for Spec-Bench's own tool.


rule specbench_table:
    input:
        [f"results/decode/specbench/{name}.jsonl" for name in SETTINGS],
    output:
        table=report("results/tables/specbench.md", caption="../report/specbench.rst", category="Tables"),
        figures="results/tables/specbench.json",
        answers=directory("results/specbench/answers"),
    params:
        offline=OFFLINE,
        cells=" ".join(f"{name}=results/decode/specbench/{name}.jsonl" for name in SETTINGS),
        baseline=specbench_baseline(),
        tokenizer=MODELS["target"],
        src=code_hash("diversed.evaluation.specbench"),
    log:
        "results/logs/specbench.log",
    conda:
        SOFTWARE
    shell:
        "{params.offline} diversed --track specbench specbench --cells {params.cells} --baseline {params.baseline}"
        " --tokenizer {params.tokenizer} --out {output.table} --answers {output.answers} > {log} 2>&1"
