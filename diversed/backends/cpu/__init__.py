"""CPU inference speed: packed oneDNN linears, their on-disk store, fp16 weights."""
