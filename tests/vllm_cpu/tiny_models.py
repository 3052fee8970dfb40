"""Tiny, randomly initialised models in the layouts vLLM-Omni 0.30 serves, built on this machine.

The end-to-end tests run real vLLM-Omni pipelines on CPU (tests/test_vllm_cpu_e2e.py). Real
weights are gigabytes and cannot be downloaded in CI, so each builder makes a model directory
with the real configuration classes, the real layout and tiny sizes: every stage, inter-stage
payload and output shape is the real one, the text and media are noise. Nothing is downloaded:
tokenizers are made here from a byte-level alphabet.

Run in the vLLM environment (tests/vllm_cpu/env.sh), which has transformers and diffusers:

    DIR/bin/python tests/vllm_cpu/tiny_models.py wan   # prints the model directory

Built models are cached under $RTC_OMNI_TINY_MODELS (default /tmp/rtc-omni-tiny-models), in a
directory named after the builder and a hash of this file, so a changed builder rebuilds.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

CACHE = Path(os.environ.get("RTC_OMNI_TINY_MODELS", "/tmp/rtc-omni-tiny-models"))
SEED = 0


def write_json(path: Path, value: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value, indent=2))


# ----------------------------------------------------------------------------- tokenizers


def byte_level_tokenizer(vocab_size: int, specials: dict[int, str], words: list[str], model_max_length: int) -> object:
    """A byte-level BPE tokenizer (GPT-2/Qwen style) whose ids run to `vocab_size`.

    Ids 0-255 are the byte alphabet, then one merge per word in `words` makes a few whole-word
    tokens; special tokens sit at the ids given (vLLM-Omni hard-codes some of them), and the gaps
    are filled with unreachable placeholders so the ids line up."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from tokenizers.pre_tokenizers import ByteLevel
    from transformers import PreTrainedTokenizerFast

    alphabet = ByteLevel.alphabet()
    vocab: dict[str, int] = {}
    for symbol in sorted(alphabet):
        vocab[symbol] = len(vocab)
    merges: list[tuple[str, str]] = []
    for word in words:
        pieces = ["Ġ"] + list(word)  # "Ġ" is the byte-level space
        current = pieces[0]
        for piece in pieces[1:]:
            merged = current + piece
            if merged not in vocab:
                merges.append((current, piece))
                vocab[merged] = len(vocab)
            current = merged
    first_special = min(specials) if specials else vocab_size
    filler = 0
    while len(vocab) < first_special:
        vocab[f"<|unused_{filler}|>"] = len(vocab)
        filler += 1
    backend = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    backend.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, model_max_length=model_max_length)
    ordered = [specials[i] for i in sorted(specials)]
    assert sorted(specials) == list(range(first_special, first_special + len(specials))), "specials must be contiguous"
    tokenizer.add_special_tokens({"additional_special_tokens": ordered})
    for token_id, token in specials.items():
        assert tokenizer.convert_tokens_to_ids(token) == token_id, (token, token_id)
    return tokenizer


WORDS = ["the", "a", "red", "blue", "green", "wall", "cat", "sky", "is", "and", "hello", "yes", "no", "sound", "tone"]


# ----------------------------------------------------------------------------- Wan 2.x (diffusion)


def build_wan(out: Path) -> None:
    """A Wan 2.x text-to-video pipeline (vLLM-Omni's Wan22Pipeline): UMT5 text encoder, Wan
    transformer, Wan VAE, UniPC scheduler, with a few hundred thousand parameters."""
    from diffusers import AutoencoderKLWan, UniPCMultistepScheduler, WanTransformer3DModel
    from transformers import UMT5Config, UMT5EncoderModel

    torch.manual_seed(SEED)
    tokenizer = byte_level_tokenizer(0, {}, WORDS, model_max_length=512)
    tokenizer.add_special_tokens({"pad_token": "<pad>", "eos_token": "</s>", "unk_token": "<unk>"})
    tokenizer.save_pretrained(out / "tokenizer")
    text_dim = 32
    encoder = UMT5EncoderModel(
        UMT5Config(
            vocab_size=len(tokenizer),
            d_model=text_dim,
            d_kv=8,
            d_ff=64,
            num_layers=2,
            num_heads=4,
            relative_attention_num_buckets=8,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
            decoder_start_token_id=tokenizer.pad_token_id,
        )
    )
    encoder.save_pretrained(out / "text_encoder")
    WanTransformer3DModel(
        patch_size=(1, 2, 2),
        num_attention_heads=2,
        attention_head_dim=12,
        in_channels=16,
        out_channels=16,
        text_dim=text_dim,
        freq_dim=256,
        ffn_dim=32,
        num_layers=2,
        cross_attn_norm=True,
        qk_norm="rms_norm_across_heads",
        rope_max_seq_len=32,
    ).save_pretrained(out / "transformer")
    AutoencoderKLWan(
        base_dim=3, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1, temperal_downsample=[False, True, True]
    ).save_pretrained(out / "vae")
    UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=3.0).save_pretrained(
        out / "scheduler"
    )
    write_json(
        out / "model_index.json",
        {
            "_class_name": "WanPipeline",
            "_diffusers_version": "0.40.0",
            "scheduler": ["diffusers", "UniPCMultistepScheduler"],
            "text_encoder": ["transformers", "UMT5EncoderModel"],
            "tokenizer": ["transformers", "PreTrainedTokenizerFast"],
            "transformer": ["diffusers", "WanTransformer3DModel"],
            "vae": ["diffusers", "AutoencoderKLWan"],
        },
    )


BUILDERS: dict[str, Callable[[Path], None]] = {"wan": build_wan}


def model_dir(name: str, cache: Path = CACHE) -> Path:
    """The directory of tiny model `name`, built on first use (atomically: a crashed build leaves nothing)."""
    builder = BUILDERS[name]
    digest = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:12]
    target = cache / f"{name}-{digest}"
    if target.is_dir():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=cache))
    try:
        builder(staging)
        staging.rename(target)
    except OSError:
        if not target.is_dir():  # another build won the race
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("name", choices=sorted(BUILDERS))
    parser.add_argument("--cache", type=Path, default=CACHE)
    args = parser.parse_args(argv)
    print(model_dir(args.name, args.cache))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
