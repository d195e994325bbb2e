"""A Hugging Face folder that headlab cannot read is refused in one line, the same for every script (issue 51).

sample.py, evaluate.py, export.py, heads.py and ``trainer.init_from`` all load through ``model/checkpoints/load.py``'s
``load_model``: a folder without ``model.safetensors`` (only ``pytorch_model.bin``, only ``config.json``, no
``config.json``) names the folder, what it holds and what is needed; a pickled ``.bin`` is never loaded, and the
conversion command the message gives really makes a folder that loads. Sharded safetensors (an index and its
shards, as ``save_pretrained`` writes a large model) load whole.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from helpers import run_script, save_tiny_hf_gpt2

from model import load_model
from model.checkpoints.pretrained import load_pretrained_gpt2


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory) -> Path:
    """A real transformers GPT-2 folder (config.json, model.safetensors), and its logits for a few ids."""
    folder = tmp_path_factory.mktemp("hf") / "gpt2-tiny"
    save_tiny_hf_gpt2(folder, n_layer=1, n_positions=16)
    return folder


def pickled_copy(hf_folder: Path, folder: Path, config: bool = True) -> Path:
    """``folder`` as transformers' older format left it: pytorch_model.bin (and config.json where ``config``)."""
    from safetensors.torch import load_file

    folder.mkdir()
    torch.save(load_file(hf_folder / "model.safetensors"), folder / "pytorch_model.bin")
    if config:
        shutil.copy(hf_folder / "config.json", folder / "config.json")
    return folder


def logits(model, ids=(1, 5, 9, 200, 3)) -> torch.Tensor:
    with torch.no_grad():
        return model.eval()(torch.tensor([ids]), torch.tensor([ids]))[0]


def refusal(folder: Path, monkeypatch) -> str:
    """load_model's one-line refusal of ``folder``, with torch.load (a pickle's loader) failing the test if called."""
    monkeypatch.setattr(torch, "load", lambda *a, **k: pytest.fail("a pickle was loaded"))
    with pytest.raises((ValueError, FileNotFoundError)) as err:
        load_model(str(folder))
    message = str(err.value)
    assert "\n" not in message and str(folder) in message, message
    return message


def test_a_folder_with_only_pytorch_model_bin_is_refused_with_a_conversion_that_works(hf_folder, tmp_path,
                                                                                      monkeypatch):  # fmt: skip
    folder = pickled_copy(hf_folder, tmp_path / "bin")
    message = refusal(folder, monkeypatch)
    assert message.startswith(f"{folder} holds pytorch_model.bin but no model.safetensors: headlab reads only "
                              f"safetensors weights"), message  # fmt: skip
    command = re.search(r'python -c "(.+)"$', message)[1]
    assert command == (f"from transformers import GPT2LMHeadModel; GPT2LMHeadModel.from_pretrained('{folder}')"
                       f".save_pretrained('{folder}', safe_serialization=True)")  # fmt: skip
    monkeypatch.undo()  # transformers loads the .bin itself (weights_only), as the user's command would
    exec(command, {})
    assert torch.equal(logits(load_pretrained_gpt2(str(folder))), logits(load_pretrained_gpt2(str(hf_folder))))


@pytest.mark.parametrize("files, says", [
    (["config.json"], "holds config.json but no weights (model.safetensors): write the folder with transformers' "
                      "save_pretrained"),
    (["pytorch_model.bin"], "holds pytorch_model.bin but no config.json: a Hugging Face folder needs config.json"),
    (["model.safetensors"], "holds model.safetensors but no config.json"),
])  # fmt: skip
def test_a_folder_missing_a_file_is_refused_naming_what_it_holds_and_needs(hf_folder, tmp_path, monkeypatch, files,
                                                                          says):  # fmt: skip
    folder = pickled_copy(hf_folder, tmp_path / "partial", config=False)
    (folder / "pytorch_model.bin").unlink()
    for name in files:
        if name == "pytorch_model.bin":
            torch.save({}, folder / name)
        else:
            shutil.copy(hf_folder / name, folder / name)
    assert refusal(folder, monkeypatch).startswith(f"{folder} {says}")


@pytest.mark.parametrize("damage, says", [
    ("config", "holds a 'llama' model, not GPT-2"),
    ("json", "config.json is not readable JSON"),
    ("weights", "model.safetensors is not a readable safetensors file"),
    ("shard", "lacks model-00002-of-00002.safetensors, one of the 2 shards model.safetensors.index.json names"),
    ("headlab", "headlab.json names no tokenizer (KeyError"),
])  # fmt: skip
def test_a_damaged_folder_is_refused_in_one_line(hf_folder, tmp_path, monkeypatch, damage, says):
    folder = tmp_path / "damaged"
    shutil.copytree(hf_folder, folder)
    if damage == "config":
        (folder / "config.json").write_text(json.dumps({"model_type": "llama", "n_head": 2}))
    elif damage == "json":
        (folder / "config.json").write_text("{not json")
    elif damage == "weights":
        (folder / "model.safetensors").write_bytes(b"\x00" * 64)
    elif damage == "headlab":
        (folder / "headlab.json").write_text("{}")  # export.py's record, without the tokenizer it names
    else:
        (folder / "model.safetensors").unlink()
        index = {"weight_map": {"wte.weight": "model-00001-of-00002.safetensors",
                                "h.0.attn.c_attn.weight": "model-00002-of-00002.safetensors"}}  # fmt: skip
        (folder / "model.safetensors.index.json").write_text(json.dumps(index))
        shutil.copy(hf_folder / "model.safetensors", folder / "model-00001-of-00002.safetensors")
    assert says in refusal(folder, monkeypatch)


def test_sharded_safetensors_load_as_the_whole_file_does(hf_folder, tmp_path):
    import transformers

    transformers.GPT2LMHeadModel.from_pretrained(hf_folder).save_pretrained(tmp_path / "sharded",
                                                                             max_shard_size="20KB")  # fmt: skip
    shards = sorted(p.name for p in (tmp_path / "sharded").glob("model-*.safetensors"))
    assert len(shards) > 1 and not (tmp_path / "sharded" / "model.safetensors").exists()
    whole, sharded = load_pretrained_gpt2(str(hf_folder)), load_pretrained_gpt2(str(tmp_path / "sharded"))
    assert torch.equal(logits(whole), logits(sharded))


COMMANDS = {
    "sample.py": ["sample.py", "source={folder}", "max_new_tokens=2", "device=cpu"],
    "evaluate.py": ["evaluate.py", "source={folder}", "device=cpu"],
    "export.py": ["export.py", "source={folder}", "out={out}"],
    "trainer.init_from": ["train.py", "trainer.init_from={folder}", "logger=none", "trainer.device=cpu",
                          "trainer.run_dir={out}"],
}  # fmt: skip


@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_script_refuses_a_pickled_folder_in_the_same_one_line(hf_folder, tmp_path, command):
    folder = pickled_copy(hf_folder, tmp_path / "bin")
    script, *args = [arg.format(folder=folder, out=tmp_path / "out") for arg in COMMANDS[command]]
    result = run_script(script, *args, cwd=tmp_path)
    assert result.returncode == 1, result.stderr[-2000:]
    assert result.stderr.strip().splitlines()[-1].startswith(f"error: {folder} holds pytorch_model.bin but no "
                                                             f"model.safetensors"), result.stderr[-2000:]  # fmt: skip
    assert "Traceback" not in result.stderr and not (tmp_path / "out").exists(), "refused before anything is written"
