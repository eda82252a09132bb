"""One tiny random fixture per mlx_vlm family: configs, processor files and image placeholders.

Each family's fixture is the smallest model its mlx_vlm module builds (2-4 layers, hidden 64, a
2-layer vision tower of width 32, 14-px patches, images resized to at most 112 px) with the
configuration files its processor reads offline, written here rather than downloaded: the
processor classes are the family's own (mlx_vlm's processing modules, transformers' image
processors). Token ids are the tiny byte-level tokenizer's, with each family's image markers
added as special tokens. What varies per family is data, so it lives in one table.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from mlx_nb.models.tiny_tokenizer import SPECIAL_TOKENS, special_id

QWEN_BLOCK = "<|vision_start|><|image_pad|><|vision_end|>"  # the image part of the shared templates


@dataclass(frozen=True)
class VisionFamily:
    """A fixture: `config.json` (token ids filled in by `token_ids`), the processor's files, and
    what its chat template writes for an image."""

    config: dict
    placeholder: str = QWEN_BLOCK
    preprocessor: Optional[dict] = None  # preprocessor_config.json
    processor: dict = field(default_factory=dict)  # processor_config.json
    markers: tuple = ()  # special tokens beyond the shared ones
    tokenizer_config: dict = field(default_factory=dict)
    template: Optional[str] = None  # None: the strict ChatML template with `placeholder` for images
    embed_scale: Optional[float] = None  # token embedding std, when the default would drown the layers


_EOS = "<|im_end|>"
_NORM = {"image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5], "do_rescale": True,
         "rescale_factor": 1 / 255, "do_normalize": True, "do_convert_rgb": True, "do_resize": True}
_LLAMA = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 128,
          "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
          "max_position_embeddings": 4096}
_QWEN_TEXT = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
              "head_dim": 16, "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "tie_word_embeddings": True}
_QWEN_VISION = {"depth": 2, "hidden_size": 32, "intermediate_size": 64, "out_hidden_size": 64, "num_heads": 2,
                "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2, "in_channels": 3}
# 14-px patches merged 2x2, so a 56x56 image is 4 tokens; the pixel cap keeps any image at most 64 tokens.
_QWEN_PIXELS = {"image_processor_type": "Qwen2VLImageProcessor", "patch_size": 14, "temporal_patch_size": 2,
                "merge_size": 2, "min_pixels": 28 * 28, "max_pixels": 224 * 224, **_NORM}
_QWEN_IDS = {"image_token_id": "<|image_pad|>", "video_token_id": "<|video_pad|>",
             "vision_start_token_id": "<|vision_start|>", "vision_end_token_id": "<|vision_end|>"}
_SIGLIP = {"model_type": "siglip_vision_model", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
           "num_attention_heads": 2, "patch_size": 14, "image_size": 56}



def _idefics3(model_type: str, processor: str) -> VisionFamily:
    return VisionFamily(
        config={"model_type": model_type, "image_token_id": "<image>", "scale_factor": 2, "text_config": _LLAMA,
                "vision_config": {**_SIGLIP, "model_type": f"{model_type}_vision"}},
        placeholder="<image>",
        preprocessor={"image_processor_type": "Idefics3ImageProcessor", "processor_class": processor,
                      "size": {"longest_edge": 112}, "max_image_size": {"longest_edge": 56},
                      "do_image_splitting": True, "do_pad": True, "resample": 1, **_NORM},
        processor={"processor_class": processor, "image_seq_len": 4},
        markers=("<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>"),
    )


def _pixtral(model_type: str, processor: str, merge: int) -> VisionFamily:
    return VisionFamily(
        config={"model_type": model_type, "image_token_index": "[IMG]", "vision_feature_layer": -1,
                "spatial_merge_size": merge, "text_config": {**_LLAMA, "model_type": "mistral", "head_dim": 16},
                "vision_config": {"model_type": "pixtral", "hidden_size": 32, "head_dim": 16, "intermediate_size": 64,
                                  "num_hidden_layers": 2, "num_attention_heads": 2, "patch_size": 14,
                                  "image_size": 112, "rope_theta": 10000.0}},
        placeholder="[IMG]",
        preprocessor={"image_processor_type": "PixtralImageProcessor", "processor_class": processor,
                      "size": {"longest_edge": 112}, "patch_size": {"height": 14, "width": 14}, **_NORM},
        processor={"processor_class": processor, "patch_size": 14, "spatial_merge_size": merge},
        markers=("[IMG]", "[IMG_BREAK]", "[IMG_END]"),
    )


FAMILIES: dict[str, VisionFamily] = {
    "tiny-qwen2.5-vl": VisionFamily(
        config={"model_type": "qwen2_5_vl", "num_hidden_layers": 2, "rope_theta": 10000.0, "bos_token_id": "<|endoftext|>",
                "rope_scaling": {"type": "mrope", "mrope_section": [4, 2, 2]}, **_QWEN_TEXT, **_QWEN_IDS,
                "vision_config": {"model_type": "qwen2_5_vl", **_QWEN_VISION, "window_size": 56,
                                  "fullatt_block_indexes": [1]}},
        preprocessor={**_QWEN_PIXELS, "processor_class": "Qwen2_5_VLProcessor"},
    ),
    "tiny-qwen2-vl": VisionFamily(
        config={"model_type": "qwen2_vl", "num_hidden_layers": 2, "rope_theta": 10000.0, "bos_token_id": "<|endoftext|>",
                "rope_scaling": {"type": "mrope", "mrope_section": [4, 2, 2]}, **_QWEN_TEXT, **_QWEN_IDS,
                "vision_config": {"model_type": "qwen2_vl", "depth": 2, "embed_dim": 32, "hidden_size": 64,
                                  "num_heads": 2, "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2,
                                  "in_channels": 3, "mlp_ratio": 2}},
        preprocessor={**_QWEN_PIXELS, "processor_class": "Qwen2VLProcessor"},
    ),
    "tiny-qwen3-vl": VisionFamily(
        config={"model_type": "qwen3_vl", **_QWEN_IDS, "tie_word_embeddings": True,
                "text_config": {"model_type": "qwen3_vl_text", "num_hidden_layers": 2, "rope_theta": 10000.0,
                                "rope_scaling": {"rope_type": "default", "mrope_section": [4, 2, 2],
                                                 "mrope_interleaved": True}, **_QWEN_TEXT},
                "vision_config": {"model_type": "qwen3_vl", "deepstack_visual_indexes": [],
                                  "num_position_embeddings": 16, **_QWEN_VISION}},
        preprocessor={**_QWEN_PIXELS, "processor_class": "Qwen3VLProcessor"},
    ),
    "tiny-qwen3.5-vl": VisionFamily(  # a vision tower over a HYBRID language model (ArraysCache + KVCache)
        config={"model_type": "qwen3_5", **_QWEN_IDS, "tie_word_embeddings": True,
                "text_config": {"model_type": "qwen3_5_text", "num_hidden_layers": 4, "linear_num_value_heads": 4,
                                "linear_num_key_heads": 2, "linear_key_head_dim": 16, "linear_value_head_dim": 16,
                                "linear_conv_kernel_dim": 4, "full_attention_interval": 2,
                                "rope_parameters": {"mrope_section": [2, 1, 1], "rope_theta": 10000.0,
                                                    "partial_rotary_factor": 0.5, "rope_type": "default"},
                                **_QWEN_TEXT},
                "vision_config": {"model_type": "qwen3_5", "num_position_embeddings": 16, **_QWEN_VISION}},
        preprocessor={**_QWEN_PIXELS, "processor_class": "Qwen3VLProcessor"},
    ),
    "tiny-gemma3-vl": VisionFamily(  # sliding-window (RotatingKVCache) and global layers
        config={"model_type": "gemma3", "image_token_index": "<image_soft_token>", "boi_token_index": "<start_of_image>",
                "eoi_token_index": "<end_of_image>", "mm_tokens_per_image": 4, "hidden_size": 64,
                "pad_token_id": "<|endoftext|>",
                "text_config": {"model_type": "gemma3_text", "hidden_size": 64, "num_hidden_layers": 4,
                                "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 1,
                                "head_dim": 16, "sliding_window": 8, "sliding_window_pattern": 2,
                                "query_pre_attn_scalar": 16, "mm_tokens_per_image": 4, "max_position_embeddings": 4096},
                "vision_config": _SIGLIP},
        placeholder="<start_of_image>",
        preprocessor={"image_processor_type": "Gemma3ImageProcessor", "processor_class": "Gemma3Processor",
                      "size": {"height": 56, "width": 56}, "do_pan_and_scan": False, **_NORM},
        processor={"processor_class": "Gemma3Processor", "image_seq_length": 4},
        markers=("<start_of_image>", "<image_soft_token>", "<end_of_image>"),
        tokenizer_config={"extra_special_tokens": {"image_token": "<image_soft_token>", "boi_token": "<start_of_image>",
                                                   "eoi_token": "<end_of_image>"}},
        embed_scale=0.05,  # embeddings are scaled by sqrt(hidden) and tied to the output: keep them small
    ),
    "tiny-idefics3": _idefics3("idefics3", "Idefics3Processor"),  # tiles plus a global view (pixel_attention_mask)
    "tiny-smolvlm": _idefics3("smolvlm", "SmolVLMProcessor"),  # Idefics3's model with SmolVLM's own processor
    "tiny-llava": VisionFamily(
        config={"model_type": "llava", "image_token_index": "<image>", "vision_feature_layer": -2,
                "vision_feature_select_strategy": "default", "text_config": _LLAMA,
                "vision_config": {**_SIGLIP, "model_type": "clip_vision_model", "projection_dim": 64}},
        placeholder="<image>",
        preprocessor={"image_processor_type": "CLIPImageProcessor", "processor_class": "LlavaProcessor",
                      "size": {"shortest_edge": 56}, "crop_size": {"height": 56, "width": 56},
                      "do_center_crop": True, "resample": 3, **_NORM},
        processor={"processor_class": "LlavaProcessor", "patch_size": 14, "vision_feature_select_strategy": "default",
                   "num_additional_image_tokens": 1},
        markers=("<image>",),
    ),
    "tiny-llava-next": VisionFamily(  # any-resolution tiles (image_sizes)
        config={"model_type": "llava_next", "image_token_index": "<image>", "vision_feature_layer": -2,
                "vision_feature_select_strategy": "default", "image_grid_pinpoints": [[56, 112], [112, 56]],
                "text_config": _LLAMA,
                "vision_config": {**_SIGLIP, "model_type": "clip_vision_model", "projection_dim": 64}},
        placeholder="<image>",
        preprocessor={"image_processor_type": "LlavaNextImageProcessor", "processor_class": "LlavaNextProcessor",
                      "image_grid_pinpoints": [[56, 112], [112, 56]], "size": {"shortest_edge": 56},
                      "crop_size": {"height": 56, "width": 56}, "do_center_crop": True, "resample": 3, **_NORM},
        processor={"processor_class": "LlavaNextProcessor", "patch_size": 14,
                   "vision_feature_select_strategy": "default", "num_additional_image_tokens": 1},
        markers=("<image>",),
    ),
    "tiny-pixtral": _pixtral("pixtral", "PixtralProcessor", merge=1),  # image rows split by [IMG_BREAK]
    "tiny-mistral3": _pixtral("mistral3", "Mistral3Processor", merge=2),  # patches merged 2x2 before the LM
    "tiny-lfm2-vl": VisionFamily(  # SigLIP2 patches over a HYBRID language model (conv ArraysCache + KVCache)
        config={"model_type": "lfm2-vl", "image_token_id": "<image>", "downsample_factor": 2, "encoder_patch_size": 14,
                "max_image_tokens": 16, "min_image_tokens": 4, "tile_size": 56, "max_num_patches": 64,
                "projector_hidden_size": 64,
                "text_config": {"model_type": "lfm2", "hidden_size": 64, "num_hidden_layers": 4, "intermediate_size": 128,
                                "num_attention_heads": 4, "num_key_value_heads": 2, "norm_eps": 1e-5,
                                "max_position_embeddings": 4096, "rope_theta": 10000.0, "conv_L_cache": 3,
                                "block_auto_adjust_ff_dim": False, "block_dim": 64, "conv_dim": 64, "conv_dim_out": 64,
                                "num_heads": 4,
                                "layer_types": ["conv", "full_attention", "conv", "full_attention"]},
                "vision_config": {"model_type": "lfm2_vl", "hidden_size": 32, "intermediate_size": 64,
                                  "num_hidden_layers": 2, "num_attention_heads": 2, "patch_size": 14,
                                  "num_patches": 64}},
        placeholder="<image>",
        preprocessor={"image_processor_type": "Lfm2VlImageProcessor", "processor_class": "Lfm2VlProcessor",
                      "downsample_factor": 2, "encoder_patch_size": 14, "max_image_tokens": 16,
                      "min_image_tokens": 4, "tile_size": 56, "max_num_patches": 64, **_NORM},
        processor={"processor_class": "Lfm2VlProcessor", "use_image_special_tokens": True},
        markers=("<image>", "<|image_start|>", "<|image_end|>", "<|img_thumbnail|>",
                 *(f"<|img_row_{r}_col_{c}|>" for r in (1, 2, 3) for c in (1, 2, 3))),
    ),
    "tiny-paligemma": VisionFamily(  # a prefix-LM: the prompt attends both ways, read in one pass
        config={"model_type": "paligemma", "image_token_index": "<image>", "hidden_size": 64, "projection_dim": 64,
                "pad_token_id": "<|endoftext|>",
                "text_config": {"model_type": "gemma", "hidden_size": 64, "num_hidden_layers": 2,
                                "intermediate_size": 128, "head_dim": 16, "num_attention_heads": 4,
                                "num_key_value_heads": 1, "rms_norm_eps": 1e-6, "max_position_embeddings": 4096,
                                "use_bidirectional_attention": True},
                "vision_config": {**_SIGLIP, "projection_dim": 64}},
        placeholder="<image>",
        preprocessor={"image_processor_type": "SiglipImageProcessor", "processor_class": "PaliGemmaProcessor",
                      "image_seq_length": 16, "size": {"height": 56, "width": 56}, "resample": 3, **_NORM},
        processor={"processor_class": "PaliGemmaProcessor"},
        markers=("<image>", "<bos>"),
        tokenizer_config={"bos_token": "<bos>"},
        # PaliGemma prompts are the images, then the text: its processor puts them there.
        template=("{%- for m in messages %}{%- if m.content is string %}{{ m.content }}{%- else %}"
                  "{%- for p in m.content %}{%- if p.type == 'text' %}{{ p.text }}{%- else %}<image>{%- endif %}"
                  "{%- endfor %}{%- endif %}{%- endfor %}"),
        embed_scale=0.05,
    ),
    "tiny-internvl": VisionFamily(  # InternVL-Chat: dynamic tiles plus a thumbnail
        config={"model_type": "internvl_chat", "image_token_index": "<IMG_CONTEXT>", "downsample_ratio": 0.5,
                "max_dynamic_patch": 2, "min_dynamic_patch": 1, "use_thumbnail": True, "force_image_size": 56,
                "text_config": {**_LLAMA, "model_type": "qwen2"},
                "vision_config": {**_SIGLIP, "model_type": "intern_vit_6b"}},
        placeholder="<image>",
        processor={"num_image_token": 4, "image_size": 56, "patch_size": 14, "downsample_ratio": 0.5},
        markers=("<img>", "</img>", "<IMG_CONTEXT>"),
    ),
    "tiny-glm4v": VisionFamily(  # GLM-4V's own mRoPE, its positions kept on the language model
        config={"model_type": "glm4v", "hidden_size": 64, "pad_token_id": "<|endoftext|>",
                "image_token_index": "<|image|>", "image_token_id": "<|image|>", "video_token_index": "<|video|>",
                "video_token_id": "<|video|>", "vision_start_token_id": "<|begin_of_image|>",
                "vision_end_token_id": "<|end_of_image|>",
                "text_config": {"model_type": "glm4v_text", "hidden_size": 64, "num_hidden_layers": 2,
                                "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
                                "rms_norm_eps": 1e-6, "max_position_embeddings": 4096, "rope_theta": 10000.0,
                                "partial_rotary_factor": 0.5, "pad_token_id": "<|endoftext|>",
                                "rope_scaling": {"rope_type": "default", "mrope_section": [2, 1, 1]}},
                "vision_config": {"model_type": "glm4v", "hidden_size": 32, "intermediate_size": 64, "depth": 2,
                                  "num_heads": 2, "out_hidden_size": 64, "patch_size": 14, "image_size": 56,
                                  "spatial_merge_size": 2, "temporal_patch_size": 2}},
        placeholder="<|begin_of_image|><|image|><|end_of_image|>",
        preprocessor={"image_processor_type": "Glm4vImageProcessor", "processor_class": "Glm46VProcessor",
                      "patch_size": 14, "temporal_patch_size": 2, "merge_size": 2,
                      "size": {"shortest_edge": 28 * 28, "longest_edge": 112 * 112}, **_NORM},
        markers=("<|begin_of_image|>", "<|image|>", "<|end_of_image|>", "<|begin_of_video|>", "<|video|>",
                 "<|end_of_video|>", "<|begin_of_box|>", "<|end_of_box|>"),
    ),
    "tiny-kimi-vl": VisionFamily(  # MoonViT over a DeepSeek-V3 language model (MLA attention, MoE)
        config={"model_type": "kimi_vl", "media_placeholder_token_id": "<|media_pad|>",
                "pad_token_id": "<|endoftext|>",
                "text_config": {"model_type": "deepseek_v3", "hidden_size": 64, "num_hidden_layers": 2,
                                "intermediate_size": 128, "moe_intermediate_size": 32, "num_attention_heads": 4,
                                "num_key_value_heads": 4, "rms_norm_eps": 1e-6, "max_position_embeddings": 4096,
                                "kv_lora_rank": 16, "q_lora_rank": None, "qk_rope_head_dim": 8,
                                "qk_nope_head_dim": 16, "v_head_dim": 16, "n_routed_experts": 4,
                                "num_experts_per_tok": 2, "n_shared_experts": 1, "first_k_dense_replace": 1,
                                "n_group": 1, "topk_group": 1, "topk_method": "noaux_tc",
                                "scoring_func": "sigmoid", "rope_theta": 10000.0},
                "vision_config": {"model_type": "moonvit", "hidden_size": 32, "embed_dim": 32,
                                  "intermediate_size": 64, "depth": 2, "num_heads": 2, "patch_size": 14,
                                  "init_pos_emb_height": 8, "init_pos_emb_width": 8, "merge_kernel_size": [2, 2]}},
        placeholder="<|media_start|>image<|media_content|><|media_pad|><|media_end|>",
        markers=("<|media_start|>", "<|media_content|>", "<|media_pad|>", "<|media_end|>", "<|im_assistant|>"),
    ),
    "tiny-mllama": VisionFamily(  # Llama 3.2 Vision: image tiles read by cross-attention layers
        config={"model_type": "mllama", "image_token_index": "<|image|>",
                "text_config": {**_LLAMA, "model_type": "mllama", "num_hidden_layers": 3, "cross_attention_layers": [1]},
                "vision_config": {"image_size": 56, "patch_size": 14, "hidden_size": 32, "intermediate_size": 64,
                                  "num_hidden_layers": 2, "num_attention_heads": 2, "max_num_tiles": 4,
                                  "num_global_layers": 1, "vision_output_dim": 64, "intermediate_layers_indices": [0]}},
        placeholder="<|image|>",
        preprocessor={"image_processor_type": "MllamaImageProcessor", "processor_class": "MllamaProcessor",
                      "size": {"height": 56, "width": 56}, "max_image_tiles": 4, "do_pad": True, "resample": 2, **_NORM},
        markers=("<|image|>", "<|python_tag|>", "<bos>"),
        tokenizer_config={"bos_token": "<bos>"},
    ),
}


def vocabulary(family: VisionFamily) -> tuple:
    """The family's extra special tokens, padded with reserved ones so that every id the model can
    emit (vocab_size of them) is a token the tokenizer can decode."""
    used = 256 + len(SPECIAL_TOKENS) + len(family.markers)
    filler = -(-used // 16) * 16 - used
    return (*family.markers, *(f"<|reserved_{i}|>" for i in range(filler)))


def resolved_config(family: VisionFamily) -> dict:
    """config.json: marker names replaced by their ids, vocabulary size and EOS filled in."""
    extra = vocabulary(family)
    size = 256 + len(SPECIAL_TOKENS) + len(extra)
    eos = special_id(_EOS)

    def ids(obj):
        if isinstance(obj, dict):
            return {k: ids(v) for k, v in obj.items()}
        if isinstance(obj, str) and obj.startswith(("<", "[")) and obj in (*SPECIAL_TOKENS, *extra):
            return special_id(obj, extra)
        return obj

    config = ids(family.config)
    config.update(vocab_size=size, eos_token_id=eos)
    text = config.get("text_config")
    if isinstance(text, dict):
        text.update(vocab_size=size, eos_token_id=eos)
    return config
