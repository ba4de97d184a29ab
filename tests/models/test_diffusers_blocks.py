"""Variants of a diffusers model built with a block type no default uses, read from names
and signatures alone (no diffusers needed)."""

from __future__ import annotations

from adopter.models.diffusers_blocks import split_variant, variant_config, variant_names

BLOCKS = """
def get_up_block(up_block_type):
    if up_block_type == "UpBlock2D":
        return UpBlock2D()
    if up_block_type == "SkipUpBlock2D":
        return SkipUpBlock2D()

class UpBlock2D: ...
class SkipUpBlock2D: ...
class SkipDownBlock2D: ...
"""
DEFAULTS = {
    "down_block_types": ("DownBlock2D", "DownBlock2D"),
    "up_block_types": ("UpBlock2D", "UpBlock2D"),
    "mid_block_type": "UNetMidBlock2D",
    "block_out_channels": (32, 64),
}


def test_a_block_the_file_names_as_a_type_gets_a_variant_on_the_argument_of_its_direction():
    names = variant_names("m:Unet", DEFAULTS, {"SkipUpBlock2D", "SkipDownBlock2D"}, BLOCKS)
    # SkipDownBlock2D is a class of the file but no factory there names it as a type
    assert names == ["m:Unet[up_block_types=SkipUpBlock2D]"]
    assert variant_names("m:Unet", DEFAULTS, {"UpBlock2D"}, BLOCKS) == []  # the default's


def test_a_variant_name_says_the_argument_and_sets_it_throughout():
    base, overrides = split_variant("m:Unet[up_block_types=SkipUpBlock2D]")
    assert base == "m:Unet" and overrides == {"up_block_types": "SkipUpBlock2D"}
    assert variant_config(DEFAULTS, overrides) == {
        "up_block_types": ("SkipUpBlock2D", "SkipUpBlock2D")
    }
    assert split_variant("m:Unet") == ("m:Unet", {})
