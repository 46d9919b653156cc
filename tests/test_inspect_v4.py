"""ascend_emu.inspect's DeepSeek-V4 views: a 640-byte row decoded (against rows built by the
independent reference encoder tests/reference/v4_quant.py and decoded here with ml_dtypes), a
token's places and the three-cache block view, through the API and `ascend-emu inspect`."""

import json

import ml_dtypes
import numpy as np
import pytest

from ascend_emu import inspect
from ascend_emu.cli import main
from ascend_emu.errors import IndexRangeError, ModeError, ShapeError
from ascend_emu.layouts import V4LayerCaches
from tests.reference import v4_quant as ref


def _x(seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(512).astype(np.float32) * np.repeat(2.0 ** rng.integers(-6, 6, 8), 64)
    return x.astype(ml_dtypes.bfloat16)


def test_v4_row_decodes_the_reference_row():
    x = _x()
    row = ref.kv_row_mode2(x)  # [640] uint8
    res = inspect.v4_row(row)
    assert res.fields == [("rope", 0, 128), ("values", 128, 576), ("scales", 576, 583), ("pad", 583, 640)]
    assert res.rope == x[448:].astype(np.float64).tolist()
    assert res.scale_bytes == row[576:583].tolist()
    assert res.scale_exponents == [b - 127 for b in row[576:583].tolist()]
    fp8 = row[128:576].view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    want = fp8 * np.repeat(2.0 ** (row[576:583].astype(np.float64) - 127), 64)
    assert res.values_fp8 == fp8.tolist()
    assert res.values == want.tolist()
    # the dequantized values are x to fp8's precision (3 mantissa bits)
    np.testing.assert_allclose(res.values, x[:448].astype(np.float64), rtol=2 ** -4, atol=2 ** -9)
    assert res.pad_zero and res.pad == [0] * 57


def test_v4_row_reports_dirty_padding_and_rejects_other_widths():
    row = ref.kv_row_mode2(_x(1))
    row[639] = 7
    assert not inspect.v4_row(row).pad_zero
    with pytest.raises(ShapeError, match="row"):
        inspect.v4_row(np.zeros(656, np.uint8))
    cache = np.zeros((2, 4, 1, 640), np.uint8)
    cache.reshape(-1, 640)[6] = row
    assert inspect.v4_cache_row(cache, 6).pad == row[583:].tolist()
    fp8 = cache.view(ml_dtypes.float8_e4m3fn)  # the dtype the 950 caches have
    assert inspect.v4_cache_row(fp8, 6).scale_bytes == row[576:583].tolist()
    with pytest.raises(IndexRangeError, match="slot"):
        inspect.v4_cache_row(cache, 8)


def test_v4_blocks_three_caches():
    layer = V4LayerCaches("a2a3", 4, block_size=4, num_blocks=6, cmp_block_size=2, state_num_blocks=5)
    res = inspect.v4_blocks(layer, [[1, 2, 3], [4, 5, 0]], [10, 5], cmp_block_table=[[2, 0, 0], [3, 0, 0]],
                            state_block_table=[[0, 0, 4], [1, 2, 0]])
    assert res.swa.slots[0].tolist() == [4, 5, 6, 7, 8, 9, 10, 11, 12, 13]
    # 10 tokens -> 2 completed c4 rows in block 2 (slots 4, 5); 5 tokens -> 1 row in block 3 (slot 6)
    assert res.compressed.slots.tolist() == [[4, 5], [6, -1]]
    # state blocks of 8 positions: request 0's columns 0 and 1 are 0 (not updated); request 1 -> block 1
    assert [(r.column, r.block, r.first, r.stop) for r in res.state[0]] == [(0, None, 0, 8), (1, None, 8, 10)]
    assert [(r.column, r.block, r.first, r.stop) for r in res.state[1]] == [(0, 1, 0, 5)]


def test_v4_blocks_state_entry_checked():
    layer = V4LayerCaches("950", 4, block_size=4, num_blocks=4)
    with pytest.raises(IndexRangeError, match="state_block_table"):
        inspect.v4_blocks(layer, [[1, 2]], [5], state_block_table=[[9]])
    with pytest.raises(ModeError):
        inspect.v4_blocks(V4LayerCaches("950", 1, block_size=4, num_blocks=4), [[1, 2]], [5],
                          state_block_table=[[1]])


def test_cli_v4_token(capsys):
    assert main(["inspect", "v4-token", "--v4-ratio", "4", "--block-size", "16", "--num-blocks", "8",
                 "--block-table", "[3,1,5,0]", "--state-block-table", "[0,0,0,0,6,0]", "--position", "37",
                 "--seq-len", "40", "--json"]) == 0
    tok = json.loads(capsys.readouterr().out)["token"]
    assert tok["swa"]["slot"] == 85 and tok["compressed_row"] == 9 and tok["covers"] == [36, 40]
    assert tok["overlap"] == [32, 36] and tok["compressed"]["slot"] == 57 and tok["state"]["slot"] == 53
    assert tok["complete"] is True
    assert main(["inspect", "v4-token", "--v4-ratio", "128", "--soc", "950", "--block-size", "16",
                 "--block-table", "[0]", "--position", "3", "--state-block-table", "[0]"]) == 0
    out = capsys.readouterr().out
    assert "not updated" in out and "HCA" in out


def test_cli_v4_row_and_blocks(capsys, tmp_path):
    cache = np.zeros((2, 4, 1, 640), np.uint8)
    row = ref.kv_row_mode2(_x(2))
    cache.reshape(-1, 640)[5] = row
    np.save(tmp_path / "swa.npy", cache)
    assert main(["inspect", "v4-row", str(tmp_path / "swa.npy"), "--slot", "5", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["scale_bytes"] == row[576:583].tolist() and got["pad_zero"] is True
    assert main(["inspect", "v4-row", str(tmp_path / "swa.npy"), "--slot", "5"]) == 0
    assert "E8M0" in capsys.readouterr().out
    inspect.save_cache(tmp_path / "swa", inspect.Cache.from_array(cache.view(ml_dtypes.float8_e4m3fn), "PA_BSND"))
    assert main(["inspect", "v4-row", str(tmp_path / "swa.npz"), "--slot", "5", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["scale_bytes"] == row[576:583].tolist()
    assert main(["inspect", "blocks", "--v4-ratio", "128", "--soc", "950", "--block-table", "[[1,2]]",
                 "--seq-lens", "20", "--block-size", "16", "--state-block-table", "[[0,2]]", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["layer"]["state_block_size"] == 16 and got["compressed"]["slots"] == [[]]
    assert got["state"][0][1]["block"] == 2
    rc = main(["inspect", "blocks", "--block-table", "[[1]]", "--seq-lens", "2", "--block-size", "4",
               "--state-block-table", "[[1]]"])
    assert rc == 2 and "--v4-ratio" in capsys.readouterr().err


def test_cli_v4_blocks_pictures(capsys, tmp_path):
    pytest.importorskip("matplotlib")
    png = tmp_path / "layer.png"
    assert main(["inspect", "blocks", "--v4-ratio", "4", "--block-table", "[[1,2],[3,0]]", "--seq-lens", "20,5",
                 "--block-size", "16", "--num-blocks", "4", "--png", str(png)]) == 0
    out = capsys.readouterr().out
    assert "compressed cache (c4)" in out and "state cache" not in out
    for name in ("layer_swa.png", "layer_compressed.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_worked_example_on_the_950(tmp_path):
    """examples/deepseek_v4_caches.py with its 950 caches: the decode token's row decodes with zero padding."""
    import os
    import pathlib
    import subprocess
    import sys

    root = pathlib.Path(__file__).resolve().parent.parent
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])))
    env.pop("ASCEND_EMU_SOC_NAME", None)
    proc = subprocess.run([sys.executable, "-m", "ascend_emu", "run", str(root / "examples" / "deepseek_v4_caches.py"),
                           "--soc", "950"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "float8_e4m3fn" in proc.stdout and "padding all zero: True" in proc.stdout
    assert "SWA block 2 row 11 (slot 43)" in proc.stdout and "compressed row 2 at slot 18" in proc.stdout
