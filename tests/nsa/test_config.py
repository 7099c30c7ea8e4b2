import pytest

from nsa.config import NSAConfig, num_compressed, num_select_blocks

REJECTED = [
    ({"d": 5}, "d"),  # does not divide l
    ({"l": 32, "d": 8, "l_sel": 36}, "d"),  # divides l but not l_sel
    ({"l": 128, "l_sel": 64}, "l"),
    ({"n_heads": 6, "n_kv_heads": 4}, "n_heads"),
    ({"n_sel": 2}, "n_sel"),
    ({"w": 0}, "w"),
    ({"head_dim": 0}, "head_dim"),
    ({"head_dim": 7}, "head_dim"),
    ({"backend": "cuda"}, "backend"),
    ({"compressor": "max"}, "compressor"),
    ({"branches": ()}, "branches"),
    ({"branches": ("sel", "attn")}, "branches"),
    ({"dtype": "int8"}, "dtype"),
    ({"n_layers": -1}, "n_layers"),
    ({"dim": 2.5}, "dim"),
    ({"ffn_mult": 0}, "ffn_mult"),
    ({"compress_hidden": -3}, "compress_hidden"),
]


@pytest.mark.parametrize("changes,field", REJECTED)
def test_rejected_config_names_the_field(changes, field):
    with pytest.raises(ValueError) as err:
        NSAConfig(**changes).validate()
    message = str(err.value)
    assert message.startswith(f"{field}:"), message
    assert "\n" not in message


def test_replace_rejects_unknown_field():
    with pytest.raises(ValueError, match=r"^hidden: not an NSAConfig field"):
        NSAConfig().replace(hidden=3)


def test_defaults_are_the_paper_values():
    cfg = NSAConfig().validate()
    assert (cfg.l, cfg.d, cfg.l_sel, cfg.n_sel, cfg.w) == (32, 16, 64, 16, 512)
    assert cfg.group_size == 4


def test_branch_sets_are_normalised():
    assert NSAConfig(branches={"win", "cmp"}).branches == ("cmp", "win")


@pytest.mark.parametrize("seq,expected", [(31, 0), (32, 1), (47, 1), (48, 2), (100, 5)])
def test_num_compressed(seq, expected):
    assert num_compressed(seq, NSAConfig()) == expected


def test_num_select_blocks():
    assert [num_select_blocks(s, NSAConfig()) for s in (1, 64, 65, 128)] == [1, 1, 2, 2]
