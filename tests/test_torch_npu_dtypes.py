"""``torch_npu.<dtype>`` codes against the list read from the real torch_npu 2.14 wheel
(``tests/reference/torch_npu_2_14_dtypes.txt``, which says how it was extracted)."""

from __future__ import annotations

from pathlib import Path

import pytest

torch_npu = pytest.importorskip("ascend_emu.torch_npu")

WHEEL_LIST = Path(__file__).parent / "reference" / "torch_npu_2_14_dtypes.txt"


def _wheel_codes() -> dict[str, int]:
    codes = {}
    for line in WHEEL_LIST.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, code = line.split()
            codes[name] = int(code)
    return codes


def test_every_wheel_dtype_is_exported_with_its_code():
    wheel = _wheel_codes()
    assert len(wheel) == 27
    assert {name: getattr(torch_npu, name, None) for name in wheel} == wheel
    assert (torch_npu.float8_e5m2, torch_npu.float8_e4m3fn) == (291, 292)


def test_no_code_beyond_the_wheel_and_the_aliases():
    from ascend_emu.torch_npu._dtypes import NPU_DTYPE_ALIASES, NPU_DTYPE_CODES

    assert NPU_DTYPE_CODES == _wheel_codes()
    assert set(torch_npu.__all__) >= set(NPU_DTYPE_CODES) | set(NPU_DTYPE_ALIASES)


@pytest.mark.parametrize("alias, name", [("float8_e8m0", "float8_e8m0fnu"), ("float4_e2m1", "float4_e2m1fn_x2"),
                                         ("float4_e1m2", "float4_e1m2fn_x2")])
def test_older_names_alias_the_same_codes(alias, name):
    assert getattr(torch_npu, alias) == _wheel_codes()[name]
