"""Tiny, randomly initialised models in the layouts vLLM-Omni 0.30 serves, built on this machine.

The end-to-end tests run real vLLM-Omni pipelines on CPU (tests/test_vllm_cpu_*.py). Real
weights are gigabytes and cannot be downloaded in CI, so each builder makes a model directory
with the real configuration classes, the real layout and tiny sizes: every stage, inter-stage
payload and output shape is the real one, the text and media are noise. Nothing is downloaded:
tokenizers are made here from a byte-level alphabet.

Run in the vLLM environment (tests/vllm_cpu/env.sh), which has transformers and diffusers:

    DIR/bin/python tests/vllm_cpu/tiny_models.py wan   # prints the model directory
    DIR/bin/python tests/vllm_cpu/tiny_models.py wan helios   # one directory a line

Built models are cached under $RTC_OMNI_TINY_MODELS (default /tmp/rtc-omni-tiny-models), in a
directory named after the builder and a hash of this file, so a changed builder rebuilds. Builds
take turns (a lock file there): processes that ask together find what the first one built.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

# torch, transformers and diffusers are imported where a model is built: a cached model costs none.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

CACHE = Path(os.environ.get("RTC_OMNI_TINY_MODELS", "/tmp/rtc-omni-tiny-models"))
SEED = 0


def write_json(path: Path, value: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value, indent=2))


# ----------------------------------------------------------------------------- tokenizers


def byte_level_tokenizer(
    first_special: int | None,
    specials: list[str],
    words: list[str],
    pinned: dict[str, int] | None = None,
    **kwargs: object,
) -> Any:  # a transformers PreTrainedTokenizerFast (imported here, in the vLLM environment)
    """A byte-level BPE tokenizer (GPT-2/Qwen style) with its special tokens from id `first_special` on.

    Ids 0-255 are the byte alphabet, then merges make a few whole-word tokens: each of `words`
    with its leading space, and each of `pinned` (no space) at the id it maps to, for ids that
    vLLM-Omni hard-codes (Qwen3-Omni's "user" = 872). Every gap up to `first_special` (where
    vLLM-Omni expects the specials; None: right after the words) is filled with placeholders that
    no text encodes to. `kwargs` go to PreTrainedTokenizerFast (eos_token, ...)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from tokenizers.pre_tokenizers import ByteLevel
    from transformers import PreTrainedTokenizerFast

    pinned = pinned or {}
    taken = set(pinned.values())
    vocab = {symbol: index for index, symbol in enumerate(sorted(ByteLevel.alphabet()))}
    next_id = len(vocab)
    merges: list[tuple[str, str]] = []

    def merge(word: str, start: str) -> None:
        nonlocal next_id
        current = start
        for piece in word:
            if current + piece not in vocab:
                merges.append((current, piece))
                if current + piece in pinned:
                    vocab[current + piece] = pinned[current + piece]
                else:
                    while next_id in taken:
                        next_id += 1
                    vocab[current + piece] = next_id
                    next_id += 1
            current += piece

    for word in words:
        merge(word, "Ġ")  # the byte-level space: these words are merged with their leading space
    for word in pinned:
        merge(word[1:], word[0])
    first_special = next_id if first_special is None else first_special
    assert max(vocab.values()) < first_special
    ids = set(vocab.values())
    for filler in range(first_special):
        if filler not in ids:
            vocab[f"<|unused_{filler}|>"] = filler
    backend = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([AddedToken(token, special=True, normalized=False) for token in specials])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, **kwargs)
    for offset, token in enumerate(specials):
        assert tokenizer.convert_tokens_to_ids(token) == first_special + offset, token
    return tokenizer


def text_token_ids(tokenizer: Any) -> list[int]:
    """The ids that decode to printable text: printable ASCII bytes and the merged words (a random
    model limited to them writes readable noise, never half a UTF-8 character)."""
    printable = {chr(c) for c in range(33, 127)} | {"Ġ"}  # "Ġ" is the byte-level space
    vocab = tokenizer.get_vocab().items()
    return [i for token, i in vocab if set(token) <= printable and not token.startswith("<|")]  # no fillers


WORDS = ["the", "a", "red", "blue", "green", "wall", "cat", "sky", "is", "and", "hello", "yes", "no", "sound", "tone"]


# ----------------------------------------------------------------------------- Wan 2.x (diffusion)


def build_umt5_vae(out: Path) -> int:
    """The parts Wan and Helios share: a byte-level tokenizer, a UMT5 text encoder and a Wan VAE
    (4x in time, 8x in space, 16 latent channels). Returns the text encoder's width."""
    from diffusers import AutoencoderKLWan
    from transformers import UMT5Config, UMT5EncoderModel

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
    # One residual block a level, 3 channels: the decoder works at full resolution, and vLLM-Omni's
    # start-up warm-up decodes 33 frames at 512x512 for Helios (17 s with two blocks, 9 s with one).
    AutoencoderKLWan(
        base_dim=3, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=0, temperal_downsample=[False, True, True]
    ).save_pretrained(out / "vae")
    return text_dim


def build_wan(out: Path) -> None:
    """A Wan 2.x text-to-video pipeline (vLLM-Omni's Wan22Pipeline): UMT5 text encoder, Wan
    transformer, Wan VAE, UniPC scheduler, with a few hundred thousand parameters."""
    import torch
    from diffusers import UniPCMultistepScheduler, WanTransformer3DModel

    torch.manual_seed(SEED)
    text_dim = build_umt5_vae(out)
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


# ----------------------------------------------------------------------------- Helios (diffusion, chunked)


def build_helios(out: Path) -> None:
    """A Helios text-to-video pipeline (vLLM-Omni's HeliosPipeline): Wan's text encoder and VAE, the
    Helios transformer with its multi-term memory patches, the Helios scheduler. It generates in
    chunks of 33 frames and streams them with `diffusion-streaming-output`."""
    import torch
    from diffusers import HeliosScheduler, HeliosTransformer3DModel

    torch.manual_seed(SEED)
    text_dim = build_umt5_vae(out)
    HeliosTransformer3DModel(
        patch_size=(1, 2, 2),
        num_attention_heads=2,
        attention_head_dim=16,
        in_channels=16,
        out_channels=16,
        text_dim=text_dim,
        freq_dim=32,
        ffn_dim=32,
        num_layers=1,
        rope_dim=(4, 6, 6),  # time, height, width: the head's 16 dimensions
    ).save_pretrained(out / "transformer")
    HeliosScheduler().save_pretrained(out / "scheduler")
    write_json(
        out / "model_index.json",
        {
            "_class_name": "HeliosPipeline",
            "_diffusers_version": "0.40.0",
            "scheduler": ["diffusers", "HeliosScheduler"],
            "text_encoder": ["transformers", "UMT5EncoderModel"],
            "tokenizer": ["transformers", "PreTrainedTokenizerFast"],
            "transformer": ["diffusers", "HeliosTransformer3DModel"],
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


def qwen_processor_parts(tokenizer: object, patch: int = 28) -> dict[str, object]:
    """Image, video and audio preprocessors as Qwen-Omni's processor wants them, small images.
    `patch`: the pixels of one vision token (Qwen2.5: 14 x 2 merged; Qwen3: 16 x 2)."""
    from transformers import Qwen2VLImageProcessor, WhisperFeatureExtractor
    from transformers.models.qwen2_vl.video_processing_qwen2_vl import Qwen2VLVideoProcessor

    pixels = {"min_pixels": 4 * patch * patch, "max_pixels": 64 * patch * patch}  # at most 64 tokens a frame
    sizes = {} if patch == 28 else {"patch_size": patch // 2, "merge_size": 2}
    return {
        "image_processor": Qwen2VLImageProcessor(**pixels, **sizes),
        "video_processor": Qwen2VLVideoProcessor(**pixels, **sizes),
        "feature_extractor": WhisperFeatureExtractor(feature_size=128),
        "tokenizer": tokenizer,
    }


def keep_rows(weight: torch.Tensor, allowed: list[int]) -> None:
    """Zero every row of an output head but `allowed`, and scale those up (in place)."""
    import torch

    mask = torch.zeros(weight.shape[0], dtype=torch.bool)
    mask[allowed] = True
    with torch.no_grad():
        weight[~mask] = 0
        weight[mask] *= LOGIT_SCALE


def build_qwen2_5_omni(out: Path) -> None:
    """Qwen2.5-Omni with all three stages (thinker, talker, code2wav). The thinker keeps the real
    vocabulary size (152064): vLLM-Omni's talker indexes the thinker embedding with fixed ids."""
    import torch
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


# ------------------------------------------------------------------------ Qwen3-Omni MoE (thinker, talker, code2wav)

# Qwen3-Omni's added tokens, from <|endoftext|> (151643) on, in the real tokenizer's order: vLLM-Omni
# hard-codes the audio and TTS ids (151669-151675) and the config names the vision ones.
QWEN3_SPECIALS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
    "<|audio_start|>",
    "<|audio_end|>",
    "<tts_pad>",
    "<tts_text_bos>",
    "<tts_text_eod>",
    "<tts_text_bos_single>",
    "<|audio_pad|>",
]
# vLLM-Omni finds the roles of a Qwen3-Omni prompt by these ids (the token after <|im_start|>).
QWEN3_ROLES = {"system": 8948, "user": 872, "assistant": 77091}
QWEN3_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'text' %}{{ part['text'] }}"
    "{% elif part['type'] in ('image', 'image_url', 'image_pil') %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif part['type'] in ('video', 'video_url') %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif part['type'] in ('audio', 'audio_url', 'input_audio') %}<|audio_start|><|audio_pad|><|audio_end|>"
    "{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
QWEN3_CODEC_END = 2150  # the talker's end-of-speech code (the real config's codec ids are 2148-2157)


def build_qwen3_omni_moe(out: Path) -> None:
    """Qwen3-Omni MoE with all three stages (thinker, talker + code predictor, code2wav), in the
    real 30B-A3B layout: MoE thinker and talker, 16 code groups, the real special-token ids."""
    import torch
    from transformers import Qwen3OmniMoeConfig, Qwen3OmniMoeForConditionalGeneration, Qwen3OmniMoeProcessor

    torch.manual_seed(SEED)
    tokenizer = byte_level_tokenizer(
        QWEN25_FIRST_SPECIAL,
        QWEN3_SPECIALS,
        WORDS,
        pinned=QWEN3_ROLES,
        model_max_length=32768,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        model_specific_special_tokens={
            "image_token": "<|image_pad|>",
            "audio_token": "<|audio_pad|>",
            "video_token": "<|video_pad|>",
            "vision_bos_token": "<|vision_start|>",
            "vision_eos_token": "<|vision_end|>",
            "audio_bos_token": "<|audio_start|>",
            "audio_eos_token": "<|audio_end|>",
        },
    )
    for role, token_id in QWEN3_ROLES.items():
        assert tokenizer.encode(role) == [token_id], role
    # Heads 32 wide (vLLM's CPU attention); interleaved M-RoPE splits head_dim / 2 in three.
    mrope = {"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [6, 5, 5], "interleaved": True}
    moe = {
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 32,
        "intermediate_size": 128,
        "moe_intermediate_size": 64,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "max_position_embeddings": 32768,
        "rope_parameters": mrope,
    }
    config = Qwen3OmniMoeConfig(
        thinker_config={
            "text_config": {**moe, "vocab_size": 152064, "hidden_size": THINKER_HIDDEN},
            "audio_config": {
                "num_mel_bins": 128,
                "encoder_layers": 2,
                "encoder_attention_heads": 2,
                "encoder_ffn_dim": 64,
                "d_model": 32,
                "output_dim": THINKER_HIDDEN,
                "downsample_hidden_size": 32,
            },
            "vision_config": {
                "depth": 2,
                "hidden_size": 64,
                "intermediate_size": 128,
                "num_heads": 2,
                "out_hidden_size": THINKER_HIDDEN,
                "deepstack_visual_indexes": [1],
                "num_position_embeddings": 256,
            },
            "audio_token_id": 151675,
            "image_token_id": 151655,
            "video_token_id": 151656,
            "audio_start_token_id": 151669,
            "position_id_per_seconds": 13,
        },
        talker_config={
            "text_config": {**moe, "vocab_size": 3072, "hidden_size": 64, "shared_expert_intermediate_size": 64},
            "code_predictor_config": {
                "vocab_size": 2048,
                "hidden_size": 64,
                "intermediate_size": 128,
                "num_hidden_layers": 1,
                "num_attention_heads": 2,
                "num_key_value_heads": 1,
                "head_dim": 32,
                "num_code_groups": 16,
            },
            "num_code_groups": 16,
            "thinker_hidden_size": THINKER_HIDDEN,
            "accept_hidden_layer": 1,
            "codec_pad_id": 2148,
            "codec_bos_id": 2149,
            "codec_eos_token_id": QWEN3_CODEC_END,
            "codec_nothink_id": 2155,
            "codec_think_bos_id": 2156,
            "codec_think_eos_id": 2157,
            "audio_token_id": 151675,
            "image_token_id": 151655,
            "video_token_id": 151656,
            "vision_start_token_id": 151652,
            "audio_start_token_id": 151669,
            "position_id_per_seconds": 13,
            "speaker_id": {"chelsie": 2301, "ethan": 2302, "aiden": 2303},
            "spatial_merge_size": 2,
        },
        code2wav_config={
            "codebook_size": 2048,
            "hidden_size": 64,
            "num_attention_heads": 2,
            "num_key_value_heads": 2,
            "intermediate_size": 128,
            "num_hidden_layers": 1,
            "num_quantizers": 16,
            "decoder_dim": 64,
        },
    )
    config.architectures = ["Qwen3OmniMoeForConditionalGeneration"]
    # In the real config.json but not fields of transformers' classes; vLLM's thinker reads them.
    config.thinker_config.audio_end_token_id = 151670
    vision = config.thinker_config.vision_config
    vision.apply_vit_abs_pos_embed = True
    vision.image_size = 16 * vision.patch_size  # vLLM sizes the position table (image_size / patch)^2: 256
    model = Qwen3OmniMoeForConditionalGeneration(config).eval()
    keep_rows(model.thinker.lm_head.weight, text_token_ids(tokenizer) + [tokenizer.eos_token_id])
    keep_rows(model.talker.codec_head.weight, list(range(TALKER_CODES)) + [QWEN3_CODEC_END])
    with torch.no_grad():
        model.code2wav.decoder[-1].conv.weight *= 3e5  # the random vocoder's waveform is ~1e-7 RMS; make it audible
    model.save_pretrained(out)
    Qwen3OmniMoeProcessor(
        **qwen_processor_parts(tokenizer, patch=32), chat_template=QWEN3_CHAT_TEMPLATE
    ).save_pretrained(out)


BUILDERS: dict[str, Callable[[Path], None]] = {
    "wan": build_wan,
    "helios": build_helios,
    "qwen2_5_omni": build_qwen2_5_omni,
    "qwen3_omni_moe": build_qwen3_omni_moe,
}


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
    parser.add_argument("name", nargs="+", choices=sorted(BUILDERS), help="one line out per name, in order")
    parser.add_argument("--cache", type=Path, default=CACHE)
    args = parser.parse_args(argv)
    args.cache.mkdir(parents=True, exist_ok=True)
    # One build at a time: the suite's workers ask together, and the first builds for all of them.
    with (args.cache / ".build.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for name in args.name:  # several in one process: torch, transformers and diffusers load once
            print(model_dir(name, args.cache), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
