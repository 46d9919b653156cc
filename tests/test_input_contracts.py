"""ascend_emu.input_contracts: each deliberately broken step input is reported with its argument,
position and rule: a warning by default, an error in checked mode; a sound step is silent; the
paged attention ops check their own block table's tails."""

from __future__ import annotations

import re
import warnings

import numpy as np
import pytest

from ascend_emu import checked_mode, ops
from ascend_emu.errors import InputContractError, InputContractWarning
from ascend_emu.input_contracts import RULES, check_step

BS = 4
#: A sound decode step of three requests: 1, 2 and 1 new tokens, kv lengths after the step.
SOUND = dict(block_size=BS, block_table=np.array([[3, 5, 0], [7, 0, 0], [2, 6, 0]], np.int32),
             seq_lens=np.array([6, 4, 8], np.int32),
             slot_mapping=np.array([5 * BS + 1, 7 * BS + 2, 7 * BS + 3, 6 * BS + 3, -1, -1], np.int32),
             query_start_loc=np.array([0, 1, 3, 4], np.int32),
             state_block_table=np.array([[4], [1], [0]], np.int32), state_lens=np.array([1, 2, 0], np.int32),
             state_block_size=8)


def _broken(**change):
    return {**SOUND, **{k: np.array(v, np.int32) for k, v in change.items()}}


# (case, change to the sound step, argument and position named, rule)
CASES = [
    ("decreasing query_start_loc", dict(query_start_loc=[0, 3, 1, 4]), "query_start_loc[2] = 1", "cu_seqlens_non_decreasing"),
    ("decreasing cu_seqlens", dict(cu_seqlens=[0, 5, 4]), "cu_seqlens[2] = 4", "cu_seqlens_non_decreasing"),
    ("table tail on a block another request writes", dict(block_table=[[3, 5, 7], [7, 0, 0], [2, 6, 0]]),
     "block_table[0, 2] = 7", "block_table_tail"),
    ("padding slot that is not -1", dict(slot_mapping=[21, 30, 31, 27, -1, 0]), "slot_mapping[5] = 0",
     "slot_mapping_padding"),
    ("negative slot other than -1", dict(slot_mapping=[21, 30, 31, -2, -1, -1]), "slot_mapping[3] = -2",
     "slot_mapping_padding"),
    ("block 0 in a V4 state table where a real block was meant", dict(state_block_table=[[4], [0], [0]]),
     "state_block_table[1, 0] = 0", "state_block_zero"),
    ("one block written by two requests", dict(slot_mapping=[5 * BS + 1, 7 * BS + 2, 5 * BS + 3, 6 * BS + 3, -1, -1]),
     "slot_mapping[2] = 23", "block_written_twice"),
]


def test_sound_step_is_silent():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert check_step("decode", **SOUND) == []


@pytest.mark.parametrize("case,change,named,rule", CASES, ids=[c[0] for c in CASES])
def test_broken_input_warns_naming_argument_position_and_rule(case, change, named, rule):
    with pytest.warns(InputContractWarning) as rec:
        found = check_step("decode", **_broken(**change))
    msg = str(rec[0].message)
    assert msg.startswith("decode: input contract broken: ") and f"{named}:" in msg
    assert f"rule {rule}: {RULES[rule]}" in msg and "an error in checked mode" in msg
    assert [v.rule for v in found] == [rule]


@pytest.mark.parametrize("case,change,named,rule", CASES, ids=[c[0] for c in CASES])
def test_broken_input_is_an_error_in_checked_mode(case, change, named, rule):
    with checked_mode.checked(), pytest.raises(InputContractError, match=re.escape(named) + f".*rule {rule}"):
        check_step("decode", **_broken(**change))


def test_torch_tensors_are_taken():
    torch = pytest.importorskip("torch")
    with pytest.warns(InputContractWarning, match=r"slot_mapping\[5\] = 0"):
        check_step("decode", block_size=BS, slot_mapping=torch.tensor([21, 30, 31, 27, -1, 0]),
                   query_start_loc=torch.tensor([0, 1, 3, 4]))


# ------------------------------------------------------------------ the ops' own hook
def _fia_case(table):
    from tests.test_fused_infer_attention_score import BF16, make_case

    q, k, v, kw = make_case(np.random.default_rng(0), "BNSD", 4, BF16, kv_lens=(20, 7), d=128, n=2)
    kw["block_table"] = table(kw["block_table"])
    return q, k, v, kw


def test_attention_op_reports_a_tail_entry_on_another_requests_block():
    q, k, v, kw = _fia_case(lambda t: t)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ops.npu_fused_infer_attention_score(q, k, v, **kw)

    def broken(t):  # request 1 needs one block; its second column points at request 0's first block
        t = t.copy()
        t[1, 1] = t[0, 0]
        return t

    q, k, v, kw = _fia_case(broken)
    with pytest.warns(InputContractWarning, match=rf"npu_fused_infer_attention_score: .*block_table\[1, 1\] = "
                                                  rf"{kw['block_table'][0, 0]}: past request 1's length 7"):
        ops.npu_fused_infer_attention_score(q, k, v, **kw)
    for cache in (k, v, kw["key_rope"]):  # filled outside the ops: no uninitialised-read report first
        checked_mode.mark_written(cache, num_slots=k.shape[0] * 16)
    with checked_mode.checked(), pytest.raises(InputContractError, match="rule block_table_tail"):
        ops.npu_fused_infer_attention_score(q, k, v, **kw)


def test_shared_prefix_blocks_are_not_a_violation_but_a_tail_on_one_is():
    """Prefix caching: two requests hold block 3 within their lengths (sound); a tail entry of
    one of them pointing at it is still reported (the other request holds it too)."""
    table, lens = np.array([[3, 5, 0], [3, 7, 0]], np.int32), np.array([6, 8], np.int32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert check_step("prefill", block_size=BS, block_table=table, seq_lens=lens) == []
    table[0, 2] = 3
    with pytest.warns(InputContractWarning, match=r"block_table\[0, 2\] = 3: .* block 3 is request 1's"):
        check_step("prefill", block_size=BS, block_table=table, seq_lens=lens)
