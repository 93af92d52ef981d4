# Spec-Bench's leaderboard: every cell's decode file read as Spec-Bench's evaluation/speed.py reads
# answer files (speed-up over plain decoding, #mean accepted tokens, per category), with the lossless
# counts against `auto` and the quality of the categories that have references; the answer files
# themselves are written beside it, for Spec-Bench's own tool.


def specbench_baseline():
    """The plain-decoding cell the speed-ups are over: the grid's `auto` setting."""
    plain = [name for name, values in SETTINGS.items() if values["method"] == "auto"]
    if "specbench" in DATASETS and len(plain) != 1:
        raise ValueError(f"decode.grid: Spec-Bench needs exactly one auto setting (its baseline), not {plain}")
    return plain[0] if plain else ""


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
