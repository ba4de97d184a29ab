"""Generic configuration shrinking: attribute-name rules, constraints, dropout zeroing."""

from __future__ import annotations

from adopter.models.transformers.shrink import (
    SHRINK_SETTINGS,
    ShrinkSetting,
    shrink_config_dict,
    zero_dropout_dict,
)

TINY = SHRINK_SETTINGS[0]
assert isinstance(TINY, ShrinkSetting)

BERT_LIKE = {
    "vocab_size": 30522,
    "hidden_size": 768,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "intermediate_size": 3072,
    "max_position_embeddings": 512,
    "type_vocab_size": 2,
    "pad_token_id": 0,
    "layer_norm_eps": 1e-12,
    "hidden_dropout_prob": 0.1,
    "attention_probs_dropout_prob": 0.1,
    "classifier_dropout": None,
    "id2label": {0: "LABEL_0", 1: "LABEL_1"},
    "num_labels": 2,
}


def test_bert_like_config_shrinks_consistently() -> None:
    overrides = shrink_config_dict(BERT_LIKE, TINY)
    assert overrides == {
        "vocab_size": TINY.vocab,
        "hidden_size": TINY.width,
        "num_hidden_layers": TINY.layers,
        "num_attention_heads": TINY.heads,
        "intermediate_size": TINY.intermediate,
        "max_position_embeddings": TINY.positions,
    }
    assert overrides["hidden_size"] % overrides["num_attention_heads"] == 0


def test_gpt2_names_and_token_ids_outside_the_new_vocabulary() -> None:
    gpt2 = {
        "vocab_size": 50257,
        "n_positions": 1024,
        "n_embd": 768,
        "n_layer": 12,
        "n_head": 12,
        "n_inner": None,
        "bos_token_id": 50256,
        "eos_token_id": 50256,
        "resid_pdrop": 0.1,
    }
    overrides = shrink_config_dict(gpt2, TINY)
    assert overrides["n_embd"] == TINY.width and overrides["n_head"] == TINY.heads
    assert overrides["n_layer"] == TINY.layers and overrides["n_positions"] == TINY.positions
    assert "n_inner" not in overrides  # None means "derive from the width"
    assert overrides["bos_token_id"] == overrides["eos_token_id"] == TINY.vocab - 1


def test_t5_head_size_and_decoder_layers() -> None:
    t5 = {
        "d_model": 512,
        "d_kv": 64,
        "d_ff": 2048,
        "num_layers": 6,
        "num_decoder_layers": 6,
        "num_heads": 8,
        "relative_attention_num_buckets": 32,
        "dropout_rate": 0.1,
    }
    overrides = shrink_config_dict(t5, TINY)
    assert overrides == {
        "d_model": TINY.width,
        "d_kv": TINY.head_dim,
        "d_ff": TINY.intermediate,
        "num_layers": 2,
        "num_decoder_layers": 2,
        "num_heads": TINY.heads,
    }


def test_stage_lists_keep_their_length() -> None:
    resnet = {
        "num_channels": 3,
        "embedding_size": 64,
        "hidden_sizes": [256, 512, 1024, 2048],
        "depths": [3, 4, 6, 3],
        "out_features": None,
    }
    overrides = shrink_config_dict(resnet, TINY)
    assert overrides["depths"] == [1, 1, 1, 1]
    # One order-keeping map for all stage lists: equal widths stay equal across lists.
    assert overrides["hidden_sizes"] == [
        5 * TINY.channels,
        6 * TINY.channels,
        7 * TINY.channels,
        8 * TINY.channels,
    ]
    assert "num_channels" not in overrides


def test_chained_channel_lists_stay_chained() -> None:
    efficientnet = {
        "in_channels": [32, 16, 24, 40, 80, 112, 192],
        "out_channels": [16, 24, 40, 80, 112, 192, 320],
    }
    overrides = shrink_config_dict(efficientnet, TINY)
    ins, outs = overrides["in_channels"], overrides["out_channels"]
    assert ins[1:] == outs[:-1] and ins[0] == 32  # small stem widths are kept
    assert max(outs) < 320


def test_image_size_stays_a_multiple_of_the_patch_size() -> None:
    vit = {"image_size": 224, "patch_size": 14, "hidden_size": 768, "num_attention_heads": 12}
    overrides = shrink_config_dict(vit, TINY)
    image = overrides["image_size"]
    patch = overrides.get("patch_size", 14)
    assert image % patch == 0 and image <= 224


def test_nested_sub_configs_shrink_but_label_maps_do_not() -> None:
    clip = {
        "text_config": {
            "model_type": "clip_text_model",
            "hidden_size": 512,
            "num_attention_heads": 8,
            "vocab_size": 49408,
        },
        "id2label": {0: "a"},
        "projection_dim": 512,
    }
    overrides = shrink_config_dict(clip, TINY)
    assert overrides["text_config"]["hidden_size"] == TINY.width
    assert overrides["text_config"]["model_type"] == "clip_text_model"
    assert "id2label" not in overrides


def test_never_grows_a_size() -> None:
    assert shrink_config_dict({"hidden_size": 8, "num_hidden_layers": 1}, TINY) == {}


def test_zero_dropout_covers_the_naming_styles() -> None:
    config = {
        **BERT_LIKE,
        "resid_pdrop": 0.1,
        "layerdrop": 0.05,
        "drop_path_rate": 0.2,
        "summary_first_dropout": 0.1,
        "text_config": {"model_type": "x", "attention_dropout": 0.1},
    }
    overrides = zero_dropout_dict(config)
    assert overrides["hidden_dropout_prob"] == 0.0
    assert overrides["attention_probs_dropout_prob"] == 0.0
    assert overrides["resid_pdrop"] == overrides["layerdrop"] == overrides["drop_path_rate"] == 0.0
    assert overrides["summary_first_dropout"] == 0.0
    assert overrides["text_config"]["attention_dropout"] == 0.0
    assert "classifier_dropout" not in overrides  # None: falls back to a zeroed one
    assert "layer_norm_eps" not in overrides


def test_repeat_patterns_follow_the_layer_count() -> None:
    gpt_neo = {
        "num_layers": 24,
        "attention_types": [[["global", "local"], 12]],
        "attention_layers": ["global", "local"] * 12,
    }
    overrides = shrink_config_dict(gpt_neo, TINY)
    assert overrides["attention_types"] == [[["global", "local"], 1]]
    assert overrides["num_layers"] == 2
    assert overrides["attention_layers"] == ["global", "local"]


def test_a_pattern_longer_than_the_target_sets_the_layer_count() -> None:
    small = SHRINK_SETTINGS[1]
    assert isinstance(small, ShrinkSetting) and small.layers == 1
    overrides = shrink_config_dict(
        {"num_layers": 24, "attention_types": [[["global", "local"], 12]]}, small
    )
    assert overrides["num_layers"] == 2  # one repeat of a two-layer pattern
    assert overrides["attention_types"] == [[["global", "local"], 1]]


def test_per_layer_lists_are_cut_to_the_new_depth() -> None:
    overrides = shrink_config_dict(
        {"num_hidden_layers": 6, "layer_types": ["a", "b", "a", "b", "a", "b"]}, TINY
    )
    assert overrides["layer_types"] == ["a", "b"]


def test_cutoffs_scale_into_the_shrunk_vocabulary() -> None:
    overrides = shrink_config_dict({"vocab_size": 267735, "cutoffs": [20000, 40000, 200000]}, TINY)
    cutoffs = overrides["cutoffs"]
    assert cutoffs == sorted(set(cutoffs)) and 0 < cutoffs[0] and cutoffs[-1] < TINY.vocab


def test_tokenizer_defined_vocabulary_gets_pad_and_mask_ids() -> None:
    overrides = shrink_config_dict(
        {"vocab_size": None, "pad_token_id": None, "mask_token_id": None, "eos_token_id": None},
        TINY,
    )
    assert overrides["vocab_size"] == TINY.vocab
    assert overrides["pad_token_id"] != overrides["mask_token_id"]
    assert max(overrides["pad_token_id"], overrides["mask_token_id"]) < TINY.vocab
    assert "eos_token_id" not in overrides


def test_switches_pick_defaults_and_library_free_backbones() -> None:
    config = {
        "default_language": None,
        "languages": ["en_XX", "de_DE"],
        "use_timm_backbone": True,
        "prediction_length": None,
        "hidden_size": 768,
    }
    overrides = shrink_config_dict(config, TINY)
    assert overrides["default_language"] == "en_XX"
    assert overrides["use_timm_backbone"] is False
    assert isinstance(overrides["prediction_length"], int)


def test_parent_channel_sizes_follow_the_backbone_widths() -> None:
    upernet_like = {
        "backbone_config": {"model_type": "resnet", "hidden_sizes": [256, 512, 1024, 2048]},
        "auxiliary_in_channels": 1024,
        "backbone_featmap_shape": [1, 2048, 7, 7],
    }
    overrides = shrink_config_dict(upernet_like, TINY)
    widths = overrides["backbone_config"]["hidden_sizes"]
    assert overrides["auxiliary_in_channels"] == widths[2]
    assert overrides["backbone_featmap_shape"] == [1, widths[3], 7, 7]


def test_grouped_setting_keeps_stage_widths_divisible_by_group_counts() -> None:
    grouped = next(s for s in SHRINK_SETTINGS if s is not None and s.name == "grouped")
    overrides = shrink_config_dict({"hidden_sizes": [256, 512, 1024, 2048]}, grouped)
    assert all(w % 128 == 0 for w in overrides.get("hidden_sizes", [256, 512, 1024, 2048]))
    assert grouped.width % 32 == 0


def test_backbone_outputs_move_to_the_stages_that_remain() -> None:
    vitdet = {
        "num_hidden_layers": 12,
        "stage_names": ["stem"] + [f"stage{i}" for i in range(1, 13)],
        "out_features": ["stage4"],
        "out_indices": [4],
    }
    overrides = shrink_config_dict(vitdet, TINY)
    assert overrides["stage_names"] == ["stem", "stage1", "stage2"]
    assert overrides["out_features"] == ["stage2"] and overrides["out_indices"] == [2]


def test_stage_names_of_per_stage_lists_are_left_alone() -> None:
    swin = {
        "num_layers": 4,
        "depths": [2, 2, 6, 2],
        "stage_names": ["stem", "stage1", "stage2", "stage3", "stage4"],
        "out_features": ["stage1", "stage2", "stage3", "stage4"],
    }
    overrides = shrink_config_dict(swin, TINY)
    assert "stage_names" not in overrides and "out_features" not in overrides


def test_per_layer_size_lists_of_other_layer_counts_keep_their_length() -> None:
    wav2vec2 = {
        "num_hidden_layers": 12,
        "num_feat_extract_layers": 7,
        "conv_stride": [5, 2, 2, 2, 2, 2, 2],
        "conv_kernel": [10, 3, 3, 3, 3, 2, 2],
    }
    overrides = shrink_config_dict(wav2vec2, TINY)
    assert "conv_stride" not in overrides and "conv_kernel" not in overrides


def test_hybrid_layer_lists_keep_one_layer_of_each_kind() -> None:
    kinds = (["linear_attention"] * 3 + ["full_attention"]) * 12
    mlps = ["dense"] + ["sparse"] * 47
    hybrid = {
        "num_hidden_layers": 48,
        "layer_types": kinds,
        "mlp_layer_types": mlps,
        "mlp_only_layers": [5, 9],
    }
    overrides = shrink_config_dict(hybrid, TINY)
    # first linear (0), first full (3), first dense (0), first sparse (1), first mlp-only (5)
    assert overrides["layer_types"] == [
        "linear_attention",
        "linear_attention",
        "full_attention",
        "linear_attention",
    ]
    assert overrides["mlp_layer_types"] == ["dense", "sparse", "sparse", "sparse"]
    assert overrides["mlp_only_layers"] == [3]
    assert overrides["num_hidden_layers"] == 4


def test_uniform_layer_lists_are_cut_to_the_target() -> None:
    overrides = shrink_config_dict(
        {"num_hidden_layers": 12, "layer_types": ["full_attention"] * 12}, TINY
    )
    assert overrides["layer_types"] == ["full_attention"] * TINY.layers
    assert overrides["num_hidden_layers"] == TINY.layers


def test_layer_periods_fit_the_shrunk_depth() -> None:
    jamba_like = {
        "num_hidden_layers": 32,
        "attn_layer_period": 8,
        "attn_layer_offset": 4,
        "expert_layer_period": 2,
        "expert_layer_offset": 1,
        "full_attention_interval": 4,
    }
    overrides = shrink_config_dict(jamba_like, TINY)
    assert overrides["attn_layer_period"] == 2 and overrides["attn_layer_offset"] == 1
    assert "expert_layer_period" not in overrides  # already fits
    assert overrides["full_attention_interval"] == 2


def test_a_repeating_kind_list_gets_enough_layers() -> None:
    overrides = shrink_config_dict(
        {"num_hidden_layers": 26, "block_types": ["recurrent", "recurrent", "attention"]}, TINY
    )
    assert overrides["num_hidden_layers"] == 3


def test_expert_widths_are_aligned_for_grouped_matmuls() -> None:
    overrides = shrink_config_dict(
        {"num_experts": 64, "intermediate_size": 4096, "moe_intermediate_size": 1024}, TINY
    )
    assert overrides["intermediate_size"] % 8 == 0 and overrides["moe_intermediate_size"] % 8 == 0
    dense = shrink_config_dict({"intermediate_size": 4096}, TINY)
    assert dense["intermediate_size"] == TINY.intermediate


def test_state_space_heads_follow_the_expanded_width() -> None:
    mamba2 = {"hidden_size": 4096, "expand": 2, "num_heads": 128, "head_dim": 64, "n_groups": 8}
    overrides = shrink_config_dict(mamba2, TINY)
    heads, dim = overrides["num_heads"], overrides["head_dim"]
    assert heads * dim == mamba2["expand"] * overrides["hidden_size"]
    assert heads % overrides["n_groups"] == 0
    hybrid = {"hidden_size": 4096, "mamba_expand": 2, "mamba_n_heads": 128, "mamba_d_head": 64}
    overrides = shrink_config_dict(hybrid, TINY)
    assert overrides["mamba_n_heads"] * overrides["mamba_d_head"] == 2 * overrides["hidden_size"]


def test_per_layer_settings_keyed_by_index_follow_the_selection() -> None:
    text = {
        "num_hidden_layers": 30,
        "layer_types": (["sliding_attention"] * 5 + ["full_attention"]) * 5,
        "per_layer_config": {"05": {"head_dim": 512}, "11": {"head_dim": 512}},
    }
    overrides = shrink_config_dict({"text_config": {"model_type": "t", **text}}, TINY)
    shrunk = overrides["text_config"]
    assert shrunk["layer_types"] == ["sliding_attention", "full_attention"]
    assert shrunk["per_layer_config"] == {"01": {"head_dim": 512}}
    assert shrunk["num_hidden_layers"] == 2


def test_a_head_size_left_to_derive_is_given() -> None:
    overrides = shrink_config_dict(
        {"hidden_size": 4096, "num_attention_heads": 32, "head_dim": None}, TINY
    )
    assert overrides["head_dim"] == TINY.width // TINY.heads


def test_per_stage_widths_under_a_width_name_are_a_width_list() -> None:
    overrides = shrink_config_dict({"embed_dim": [128, 256, 512, 1024]}, TINY)
    assert overrides["embed_dim"] == sorted(overrides["embed_dim"])
    assert max(overrides["embed_dim"]) < 1024


def test_hybrids_without_attention_by_default_get_one_attention_layer() -> None:
    bamba_like = {"num_hidden_layers": 32, "attn_layer_indices": None}
    assert shrink_config_dict(bamba_like, TINY)["attn_layer_indices"] == [TINY.layers - 1]
    all_linear = {"num_hidden_layers": 32, "layer_types": ["linear_attention"] * 32}
    assert shrink_config_dict(all_linear, TINY)["layer_types"] == [
        "linear_attention",
        "full_attention",
    ]


def test_a_first_stage_channel_count_that_later_stages_multiply_shrinks() -> None:
    overrides = shrink_config_dict({"num_filters": 32, "downsampling_ratios": [2, 4, 8]}, TINY)
    assert overrides == {"num_filters": TINY.channels}


def test_per_layer_value_lists_follow_the_kept_layers() -> None:
    gemma3n_like = {
        "num_hidden_layers": 35,
        "intermediate_size": [16384] * 35,
        "activation_sparsity_pattern": [0.95] * 10 + [0.0] * 25,
        "conv_stride": [5] + [2] * 34,  # another count's list: left alone
    }
    overrides = shrink_config_dict(gemma3n_like, TINY)
    assert overrides["num_hidden_layers"] == 2
    assert overrides["intermediate_size"] == [TINY.intermediate] * 2
    assert overrides["activation_sparsity_pattern"] == [0.95, 0.0]
    assert "conv_stride" not in overrides


def test_grouped_query_attention_stays_grouped() -> None:
    tiny = SHRINK_SETTINGS[0]
    assert tiny is not None
    grouped = {"hidden_size": 4096, "num_attention_heads": 64, "num_key_value_heads": 4}
    shrunk = shrink_config_dict(grouped, tiny)
    assert shrunk["num_attention_heads"] == 2 and shrunk["num_key_value_heads"] == 1
    multi_head = {"hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 32}
    assert shrink_config_dict(multi_head, tiny)["num_key_value_heads"] == 2


def test_an_unset_key_value_head_count_is_the_query_head_count() -> None:
    """Nemotron's configuration leaves ``num_key_value_heads`` None and its attention divides
    by it: the shrunk configuration says multi-head, as configurations that fill it in do."""
    unset = {"hidden_size": 6144, "num_attention_heads": 48, "num_key_value_heads": None}
    shrunk = shrink_config_dict(unset, TINY)
    assert shrunk["num_key_value_heads"] == shrunk["num_attention_heads"] == 2
    assert "num_key_value_heads" not in shrink_config_dict({"num_key_value_heads": None}, TINY)


def test_a_flag_per_layer_under_an_index_list_name_keeps_each_kind() -> None:
    tiny = SHRINK_SETTINGS[0]
    assert tiny is not None
    flags = {"num_hidden_layers": 8, "no_rope_layers": [1, 1, 1, 0, 1, 1, 1, 0]}
    shrunk = shrink_config_dict(flags, tiny)
    assert shrunk["no_rope_layers"] == [1, 0] and shrunk["num_hidden_layers"] == 2
    indices = {"num_hidden_layers": 8, "mlp_only_layers": [0, 5]}
    assert shrink_config_dict(indices, tiny)["mlp_only_layers"] == [0]


def test_expert_counts_left_unset_get_small_ones() -> None:
    # transformers 5.24's Dots1Config: the counts are only in each checkpoint's configuration
    dots = {"hidden_size": 4096, "n_routed_experts": None, "num_experts_per_tok": None}
    dots |= {"n_shared_experts": None, "moe_intermediate_size": 1408}
    overrides = shrink_config_dict(dots, TINY)
    assert overrides["n_routed_experts"] == 4 and overrides["num_experts_per_tok"] == 2
    assert overrides["n_shared_experts"] == 1
    # DeepSeek-V2: the experts counted, the experts per token not
    deepseek = {"hidden_size": 4096, "n_routed_experts": 64, "num_experts_per_tok": None}
    overrides = shrink_config_dict(deepseek, TINY)
    assert overrides["num_experts_per_tok"] == 2 and "n_routed_experts" not in overrides
    # counts that are set stay as they are
    set_counts = {"hidden_size": 64, "num_local_experts": 8, "num_experts_per_tok": 2}
    assert "num_experts_per_tok" not in shrink_config_dict(set_counts, TINY)


def test_a_detector_keeps_few_object_queries() -> None:
    # RT-DETR picks its top num_queries anchors; a 32-pixel image has 21 of them
    overrides = shrink_config_dict({"d_model": 256, "num_queries": 300}, TINY)
    assert overrides["num_queries"] == TINY.frames == 4
    assert "num_queries" not in shrink_config_dict({"num_queries": 3}, TINY)
