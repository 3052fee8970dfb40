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


def byte_level_tokenizer(first_special: int | None, specials: list[str], words: list[str], **kwargs: object) -> object:
    """A byte-level BPE tokenizer (GPT-2/Qwen style) with its special tokens from id `first_special` on.

    Ids 0-255 are the byte alphabet, then one merge per word in `words` makes a few whole-word
    tokens; the gap up to `first_special` (where vLLM-Omni expects the specials; None: right after
    the words) is filled with placeholders that no text encodes to. `kwargs` go to
    PreTrainedTokenizerFast (eos_token, ...)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from tokenizers.pre_tokenizers import ByteLevel
    from transformers import PreTrainedTokenizerFast

    vocab = {symbol: index for index, symbol in enumerate(sorted(ByteLevel.alphabet()))}
    merges: list[tuple[str, str]] = []
    for word in words:
        current = "Ġ"  # the byte-level space: the words are merged with their leading space
        for piece in word:
            if current + piece not in vocab:
                merges.append((current, piece))
                vocab[current + piece] = len(vocab)
            current += piece
    first_special = len(vocab) if first_special is None else first_special
    filler = 0
    while len(vocab) < first_special:
        vocab[f"<|unused_{filler}|>"] = len(vocab)
        filler += 1
    backend = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([AddedToken(token, special=True, normalized=False) for token in specials])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, **kwargs)
    for offset, token in enumerate(specials):
        assert tokenizer.convert_tokens_to_ids(token) == first_special + offset, token
    return tokenizer


def text_token_ids(tokenizer: object) -> list[int]:
    """The ids that decode to printable text: printable ASCII bytes and the merged words (a random
    model limited to them writes readable noise, never half a UTF-8 character)."""
    printable = {chr(c) for c in range(33, 127)} | {"Ġ"}  # "Ġ" is the byte-level space
    vocab = tokenizer.get_vocab().items()
    return [i for token, i in vocab if set(token) <= printable and not token.startswith("<|")]  # no fillers


WORDS = ["the", "a", "red", "blue", "green", "wall", "cat", "sky", "is", "and", "hello", "yes", "no", "sound", "tone"]


# ----------------------------------------------------------------------------- Wan 2.x (diffusion)


def build_wan(out: Path) -> None:
    """A Wan 2.x text-to-video pipeline (vLLM-Omni's Wan22Pipeline): UMT5 text encoder, Wan
    transformer, Wan VAE, UniPC scheduler, with a few hundred thousand parameters."""
    from diffusers import AutoencoderKLWan, UniPCMultistepScheduler, WanTransformer3DModel
    from transformers import UMT5Config, UMT5EncoderModel

    torch.manual_seed(SEED)
    tokenizer = byte_level_tokenizer(
        None,
        ["<pad>", "</s>", "<unk>"],
        WORDS,
        model_max_length=512,
        pad_token="<pad>",
        eos_token="</s>",
        unk_token="<unk>",
    )
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


# ----------------------------------------------------------------------------- Qwen2.5-Omni (thinker, talker, code2wav)

# Qwen2.5-Omni's added tokens, from <|endoftext|> on: the chat, audio and vision markers.
QWEN25_SPECIALS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|AUDIO|>",
    "<|audio_bos|>",
    "<|audio_eos|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_bos|>",
    "<|vision_eos|>",
    "<|vision_pad|>",
    "<|IMAGE|>",
    "<|VIDEO|>",
]
QWEN25_FIRST_SPECIAL = 151643
QWEN_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'text' %}{{ part['text'] }}"
    "{% elif part['type'] in ('image', 'image_url', 'image_pil') %}<|vision_bos|><|IMAGE|><|vision_eos|>"
    "{% elif part['type'] in ('video', 'video_url') %}<|vision_bos|><|VIDEO|><|vision_eos|>"
    "{% elif part['type'] in ('audio', 'audio_url', 'input_audio') %}<|audio_bos|><|AUDIO|><|audio_eos|>"
    "{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
THINKER_HIDDEN = 64
TALKER_CODES = 63  # codes the tiny talker may emit (code2wav embeds 8193): with its end code, ~64 per answer
LOGIT_SCALE = 50.0  # random heads scaled up, so that allowed tokens dominate the zeroed rows


def qwen_processor_parts(tokenizer: object) -> dict[str, object]:
    """Image, video and audio preprocessors as Qwen-Omni's processor wants them, small images."""
    from transformers import Qwen2VLImageProcessor, WhisperFeatureExtractor
    from transformers.models.qwen2_vl.video_processing_qwen2_vl import Qwen2VLVideoProcessor

    pixels = {"min_pixels": 4 * 28 * 28, "max_pixels": 64 * 28 * 28}  # at most 64 tokens a frame
    return {
        "image_processor": Qwen2VLImageProcessor(**pixels),
        "video_processor": Qwen2VLVideoProcessor(**pixels),
        "feature_extractor": WhisperFeatureExtractor(feature_size=128),
        "tokenizer": tokenizer,
    }


def keep_rows(weight: torch.Tensor, allowed: list[int]) -> None:
    """Zero every row of an output head but `allowed`, and scale those up (in place)."""
    mask = torch.zeros(weight.shape[0], dtype=torch.bool)
    mask[allowed] = True
    with torch.no_grad():
        weight[~mask] = 0
        weight[mask] *= LOGIT_SCALE


def build_qwen2_5_omni(out: Path) -> None:
    """Qwen2.5-Omni with all three stages (thinker, talker, code2wav). The thinker keeps the real
    vocabulary size (152064): vLLM-Omni's talker indexes the thinker embedding with fixed ids."""
    from transformers import Qwen2_5OmniConfig, Qwen2_5OmniForConditionalGeneration, Qwen2_5OmniProcessor

    torch.manual_seed(SEED)
    tokenizer = byte_level_tokenizer(
        QWEN25_FIRST_SPECIAL,
        QWEN25_SPECIALS,
        WORDS,
        model_max_length=32768,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        model_specific_special_tokens={
            "image_token": "<|IMAGE|>",
            "audio_token": "<|AUDIO|>",
            "video_token": "<|VIDEO|>",
            "vision_bos_token": "<|vision_bos|>",
            "vision_eos_token": "<|vision_eos|>",
            "audio_bos_token": "<|audio_bos|>",
            "audio_eos_token": "<|audio_eos|>",
        },
    )
    # vLLM's CPU attention kernels take head sizes from 32 up; M-RoPE splits head_dim / 2 in three.
    mrope = {"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [4, 6, 6]}
    text = {
        "vocab_size": 152064,
        "hidden_size": THINKER_HIDDEN,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "max_position_embeddings": 32768,
        "rope_parameters": mrope,
        "tie_word_embeddings": False,
    }
    config = Qwen2_5OmniConfig(
        thinker_config={
            "text_config": text,
            # not fields of transformers' class, but in the real config.json, and read by vLLM-Omni's talker
            "vision_start_token_id": 151652,
            "vision_end_token_id": 151653,
            "audio_config": {
                "num_mel_bins": 128,
                "encoder_layers": 2,
                "encoder_attention_heads": 2,
                "encoder_ffn_dim": 64,
                "d_model": 32,
                "output_dim": THINKER_HIDDEN,
                "n_window": 100,
                "max_source_positions": 1500,
            },
            "vision_config": {
                "depth": 2,
                "hidden_size": 32,
                "intermediate_size": 64,
                "num_heads": 2,
                "out_hidden_size": THINKER_HIDDEN,
                "fullatt_block_indexes": [1],
                "window_size": 112,
            },
        },
        talker_config={
            "vocab_size": 8448,
            "embedding_size": THINKER_HIDDEN,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "head_dim": 32,
            "max_position_embeddings": 32768,
            "rope_parameters": mrope,
        },
        token2wav_config={
            "dit_config": {
                "hidden_size": 32,
                "num_hidden_layers": 2,
                "num_attention_heads": 2,
                "head_dim": 16,
                "ff_mult": 2,
                "emb_dim": 16,
                "enc_emb_dim": 16,
                "enc_dim": 16,
                "enc_channels": [32, 32, 32, 32, 96],
                "enc_attention_channels": 16,
                "enc_se_channels": 16,
                "look_ahead_layers": [1],
                "look_backward_layers": [0],
                "num_embeds": 8193,
                "mel_dim": 80,
                "repeats": 2,
                "block_size": 24,
            },
            "bigvgan_config": {"mel_dim": 80, "upsample_initial_channel": 64},
        },
    )
    config.architectures = ["Qwen2_5OmniModel"]
    model = Qwen2_5OmniForConditionalGeneration(config).eval()
    keep_rows(model.thinker.lm_head.weight, text_token_ids(tokenizer) + [tokenizer.eos_token_id])
    talker = config.talker_config
    keep_rows(model.talker.codec_head.weight, list(range(TALKER_CODES)) + [talker.tts_codec_end_token_id])
    vocoder_out = model.token2wav.code2wav_bigvgan_model.conv_post
    with torch.no_grad():
        vocoder_out.weight *= 3e7  # the random vocoder's waveform is ~1e-9 RMS; make it audible (~0.15)
    model.save_pretrained(out)
    dit = config.token2wav_config.dit_config
    torch.save(  # the voices code2wav conditions on (vLLM-Omni loads spk_dict.pt): float32, as in the real file
        {
            voice: {
                "cond": torch.randn(1, dit.enc_emb_dim),
                "ref_mel": torch.randn(1, 300, dit.mel_dim),
                "bos_token": bos,
            }
            for voice, bos in (("Chelsie", 151872), ("Ethan", 151870))
        },
        out / "spk_dict.pt",
    )
    Qwen2_5OmniProcessor(**qwen_processor_parts(tokenizer), chat_template=QWEN_CHAT_TEMPLATE).save_pretrained(out)


BUILDERS: dict[str, Callable[[Path], None]] = {"wan": build_wan, "qwen2_5_omni": build_qwen2_5_omni}


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
