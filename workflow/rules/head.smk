# Stage 4: train one DIVERSED ensemble head per training dataset on its stored traces (cheap; no LM runs).


rule train_head:
    input:
        "results/traces/{train_dataset}.done",
    output:
        head=directory("results/heads/{train_dataset}"),
    params:
        traces=lambda w, input: input[0].removesuffix(".done"),
        epochs=HEAD["epochs"],
        batch_size=HEAD["train_batch_size"],
        lr=HEAD["lr"],
        reg_lambda=HEAD["reg_lambda"],
        seed=HEAD["seed"],
        src=src_hash("head.py", "train.py", "traces.py"),
    resources:
        gpu=GPU,
    log:
        "results/logs/heads/{train_dataset}.log",
    shell:
        "diversed --track train_head train-head --traces {params.traces} --out {output.head}"
        " --epochs {params.epochs} --batch-size {params.batch_size} --lr {params.lr}"
        " --reg-lambda {params.reg_lambda} --seed {params.seed} --quiet > {log} 2>&1"
