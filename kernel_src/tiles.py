"""Row tiles shared by the divergence families (kl_div, tvd, jsd): a 2-D grid of
BLOCK_M rows x BLOCK_N columns per program. Pure Python, like spec.py."""
from __future__ import annotations

from typing import Callable

from .spec import Config


def row_tile_configs() -> tuple:
    """Tiles of 2048 elements on 4 warps (16 per thread: two 16-byte loads per operand in
    bf16). Short rows stack several rows per tile so few lanes are masked. Fresh objects on
    every call: configs are identity-hashed, so each family keeps its own."""
    return (
        Config({"BLOCK_M": 16, "BLOCK_N": 128}, num_warps=4),
        Config({"BLOCK_M": 4, "BLOCK_N": 512}, num_warps=4),
        Config({"BLOCK_M": 1, "BLOCK_N": 2048}, num_warps=4),
    )


def row_tile_rule(configs: tuple) -> Callable[[int], Config]:
    """The rule over `configs` (narrowest first): the first whose BLOCK_N covers the row,
    else the last."""
    def select_config(n_cols: int) -> Config:
        for config in configs[:-1]:
            if n_cols <= config.constexprs["BLOCK_N"]:
                return config
        return configs[-1]
    return select_config


def grid(n_rows: int, n_cols: int, config: Config) -> tuple:
    bm, bn = config.constexprs["BLOCK_M"], config.constexprs["BLOCK_N"]
    return ((n_rows + bm - 1) // bm, (n_cols + bn - 1) // bn)
