"""Every config option composes and validates; bad settings are refused before any work."""

from __future__ import annotations

import pytest
from helpers import CONFIGS, TINY, compose_train, run_cli, user_env
from hydra.errors import ConfigCompositionException, MissingConfigException
from omegaconf import OmegaConf
from omegaconf.errors import ValidationError

from model.registry import MIXERS
from training.config import TrainConfig, grad_accum_steps, micro_batch_for, validate
from training.loop import train

GROUPS = ["model", "attention", "kernel", "data", "optim", "trainer", "logger", "experiment"]
# Options that need a value only the user can give.
REQUIRED = {("data", "files"): ["data.path=some/dir"], ("data", "hub"): ["data.path=user/dataset"]}


def all_options():
    for group in GROUPS:
        for path in sorted((CONFIGS / group).glob("*.yaml")):
            yield group, path.stem


@pytest.mark.parametrize("group,option", list(all_options()))
def test_every_group_option_composes_and_validates(group, option):
    cfg = compose_train(f"{group}={option}", *REQUIRED.get((group, option), []))
    config = OmegaConf.to_object(cfg)
    assert isinstance(config, TrainConfig)
    validate(config)
    if group == "attention":
        assert config.model.attention == option
    elif group == "kernel":
        # kernel=sdpa_<backend> is SDPA restricted to one of its implementations.
        kernel, _, backend = option.partition("_")
        assert (config.model.kernel, config.model.sdpa_backend) == (kernel, backend or "auto")
    elif group not in ("experiment", "optim", "trainer"):
        assert getattr(config, group).name if group != "logger" else config.logger.kind


def test_attention_kernel_is_overridable_per_layout():
    config = OmegaConf.to_object(compose_train("attention=wrapper", "kernel=manual"))
    assert (config.model.attention, config.model.kernel) == ("wrapper", "manual")


def test_unknown_group_option_lists_the_choices():
    with pytest.raises(MissingConfigException, match="Could not find 'attention/fused'") as err:
        compose_train("attention=fused")
    assert "fused_qkv" in str(err.value) and "wrapper" in str(err.value)


def test_wrong_type_is_refused_by_the_schema():
    with pytest.raises(ConfigCompositionException) as err:
        compose_train("trainer.max_steps=many")
    assert isinstance(err.value.__cause__, ValidationError)
    assert "max_steps" in str(err.value.__cause__) and "many" in str(err.value.__cause__)


def test_unknown_key_is_refused_by_the_schema():
    with pytest.raises(ConfigCompositionException, match="trainer.max_step"):
        compose_train("trainer.max_step=10")


@pytest.mark.parametrize(
    "override,message",
    [
        (
            "model.n_embd=130",
            "n_embd=130 is not divisible by n_head=4; choose n_embd as a multiple of n_head",
        ),
        (
                "model.kernel=flash",
                "unknown attention kernel 'flash'; choose one of: flex, manual, sdpa",
            ),
        ("trainer.dtype=fp16", "trainer.dtype='fp16'; choose one of: auto, float32, bfloat16"),
        ("optim.min_lr=1.0", "need 0 <= min_lr <= lr"),
        ("trainer.stop_at_step=5000", "trainer.stop_at_step=5000 must be in 1..max_steps=1000"),
        ("logger.kind=tensorboard", "logger.kind='tensorboard'; choose one of: wandb, none"),
        ("data.source=ftp", "unknown data source 'ftp'"),
        ("data.tokenizer=foo", "data.tokenizer='foo'; choose one of: bytes, gpt2, r50k_base"),  # was a raw KeyError
    ],
)
def test_impossible_values_are_refused_with_the_fix(override, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        validate(OmegaConf.to_object(compose_train(override)))


def test_a_pinned_micro_batch_that_does_not_divide_a_ranks_share_is_refused_naming_smaller_ones():
    trainer = OmegaConf.to_object(compose_train("trainer.batch_size=48", "trainer.micro_batch_size=16")).trainer
    assert grad_accum_steps(trainer, world_size=1) == 3
    with pytest.raises(ValueError, match=r"trainer.micro_batch_size=16 does not divide a rank's share of the batch "
                                         r"\(trainer.batch_size=48 over 4 rank\(s\): 12 sequences\)"):  # fmt: skip
        grad_accum_steps(trainer, world_size=4)
    fix = r"set trainer.micro_batch_size to a divisor of 24 \(12, 8, 6, 4: the same batch, more accumulation steps\)"
    with pytest.raises(ValueError, match=r"micro_batch_size=16 .* 24 sequences\); " + fix):
        grad_accum_steps(trainer, world_size=2)


@pytest.mark.parametrize("world_size", [1, 2, 4, 8, 16])
def test_the_default_micro_batch_is_a_ranks_whole_share_on_any_number_of_ranks(world_size):
    trainer = OmegaConf.to_object(compose_train()).trainer
    assert trainer.micro_batch_size is None
    assert micro_batch_for(trainer, world_size) == trainer.batch_size // world_size
    assert grad_accum_steps(trainer, world_size) == 1


def test_a_batch_that_does_not_split_over_the_ranks_is_refused():
    trainer = OmegaConf.to_object(compose_train()).trainer
    with pytest.raises(ValueError, match=r"trainer.batch_size=16 does not split over 3 ranks; choose a multiple of 3"):
        micro_batch_for(trainer, 3)


def test_cuda_without_a_gpu_is_refused_before_any_work(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    cfg = compose_train(*TINY, "trainer.device=cuda", f"trainer.run_dir={tmp_path / 'run'}",
                        f"data.cache_dir={tmp_path / 'cache'}")  # fmt: skip
    with pytest.raises(ValueError, match="trainer.device=cuda but no CUDA GPU is visible.*trainer.device=cpu"):
        train(cfg)
    assert not (tmp_path / "cache").exists(), "no data was prepared"


@pytest.mark.slow
def test_trainer_gpu_without_a_gpu_is_refused_in_the_words_the_command_typed(tmp_path):
    """trainer=gpu on a CPU: the refusal names trainer=gpu, which set trainer.device=cuda (the user never typed)."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    result = run_cli("trainer=gpu", "logger=none", f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path, env=user_env())
    assert result.returncode == 1
    assert result.stderr.splitlines()[-1].startswith("error: trainer.device=cuda (set by trainer=gpu) but no CUDA GPU "
                                                     "is visible"), result.stderr[-2000:]  # fmt: skip


@pytest.mark.parametrize(("typed", "said"), [
    (["trainer=gpu"], "trainer.device=cuda (set by trainer=gpu) but ..."),
    (["experiment=gpt2_small", "logger=none"], "trainer.device=cuda (set by experiment=gpt2_small) but ..."),
    (["trainer=gpu", "trainer.device=cuda"], "trainer.device=cuda but ..."),  # typed: as typed
    (["logger=none"], "trainer.device=cuda but ..."),  # no choice typed sets it (here: not even the config)
])  # fmt: skip
def test_an_error_names_the_typed_choice_that_set_the_option_it_names(typed, said):
    from hydra import initialize_config_dir

    from cli import set_by

    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        assert set_by("trainer.device=cuda but ...", typed, "train") == said


def test_block_size_longer_than_the_data_allows_is_refused(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i in range(12):
        (corpus / f"{i}.txt").write_text(f"short document {i}\n")
    cfg = compose_train(*TINY, "data=files", f"data.path={corpus}", "data.tokenizer=bytes",
                        "model.block_size=64", "logger=none", f"trainer.run_dir={tmp_path / 'run'}",
                        f"data.cache_dir={tmp_path / 'cache'}")  # fmt: skip
    with pytest.raises(ValueError, match=r"split of .* has \d+ tokens, fewer than block_size \+ 1 = 65"):
        train(cfg)


def test_resume_from_a_missing_checkpoint_is_refused(tmp_path):
    cfg = compose_train(*TINY, f"trainer.resume={tmp_path / 'nowhere'}", f"trainer.run_dir={tmp_path}")
    with pytest.raises(FileNotFoundError, match="no checkpoint at .*nowhere.*run directory holding last.pt"):
        train(cfg)


def test_cli_reports_a_bad_override_and_exits_nonzero(tmp_path):
    result = run_cli("trainer.max_steps=many", cwd=tmp_path)
    assert result.returncode != 0
    assert "max_steps" in result.stderr and "many" in result.stderr


def test_cli_help_lists_the_groups_and_options(tmp_path):
    result = run_cli("--help", cwd=tmp_path)
    assert result.returncode == 0
    # Each group's options are its files (configs/<group>/), as Hydra reads them: none listed here by hand, so a
    # new option file is in the help with no edit; the layouts' group names every registered layout.
    groups = ["attention", "kernel", "model", "logger", "experiment", "score_mods", "kv_cache", "length_variant",
              "schedule", "mixing", "attention_2026"]  # fmt: skip
    expected = [f"{group}: {', '.join(sorted(p.stem for p in (CONFIGS / group).glob('*.yaml')))}" for group in groups]
    assert expected[0] == f"attention: {', '.join(sorted(MIXERS))}"
    for line in expected:
        assert line in result.stdout
