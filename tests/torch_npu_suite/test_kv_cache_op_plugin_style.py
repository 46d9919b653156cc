"""An operator test written the way Ascend's op-plugin tests are written (imports, device
gating, ``.npu()`` / ``device="npu"``, FRACTAL_NZ parameters, ``assertRtolEqual`` against a CPU
golden). tests/test_torch_npu_suite.py runs it unmodified through ``ascend-emu run``."""

import os
import tempfile

import numpy as np
import torch
import torch.nn as nn
import torch_npu
import torch_npu.npu.utils as utils
from torch_npu.testing.common_utils import SupportedDevices, create_common_tensor
from torch_npu.testing.testcase import TestCase, run_tests


def rms_norm_rope_golden(kv, gamma, cos, sin, eps=1e-5):
    """CPU golden: RmsNorm of kv[..., :512]; RoPE of the interleaved kv[..., 512:] (de-interleaved
    to [even | odd], then rotate-half), in fp32."""
    kv = kv.float()
    rms_in, rope_in = kv[..., :512], kv[..., 512:]
    y = rms_in / torch.sqrt((rms_in * rms_in).mean(-1, keepdim=True) + eps) * gamma.float()
    x1, x2 = rope_in[..., 0::2], rope_in[..., 1::2]
    k = torch.cat([x1, x2], -1) * cos.float() + torch.cat([-x2, x1], -1) * sin.float()
    return k, y


class TestKvRmsNormRopeCacheStyle(TestCase):
    @SupportedDevices(['Ascend910B'])
    def test_pa_bnsd_against_golden(self):
        B, S, block_num, block_size = 2, 4, 4, 16
        kv = torch.randn(B, 1, S, 576, dtype=torch.bfloat16)
        gamma = torch.rand(512, dtype=torch.bfloat16) + 0.5
        angle = torch.rand(B, 1, S, 32) * 6.28
        cos = torch.cat([angle.cos()] * 2, -1).to(torch.bfloat16)
        sin = torch.cat([angle.sin()] * 2, -1).to(torch.bfloat16)
        index = torch.randperm(block_num * block_size)[:B * S].to(torch.int64)
        k_cache = torch.zeros(block_num, block_size, 1, 64, dtype=torch.bfloat16, device="npu")
        ckv_cache = torch.zeros(block_num, block_size, 1, 512, dtype=torch.bfloat16).to("npu:0")

        golden_k, golden_y = rms_norm_rope_golden(kv, gamma, cos, sin)
        out = torch_npu.npu_kv_rmsnorm_rope_cache(kv.npu(), gamma.npu(), cos.npu(), sin.npu(), index.npu(),
                                                  k_cache, ckv_cache, cache_mode="PA_BNSD", is_output_kv=True)
        k_rows = k_cache.cpu().reshape(-1, 64)[index]
        y_rows = ckv_cache.cpu().reshape(-1, 512)[index]
        self.assertRtolEqual(k_rows.float(), golden_k.reshape(-1, 64), prec=0.005, prec16=0.005)
        self.assertRtolEqual(y_rows.float(), golden_y.reshape(-1, 512), prec=0.005, prec16=0.005)
        self.assertRtolEqual(out[2].cpu(), golden_k.to(torch.bfloat16), prec=0.01, prec16=0.01)
        self.assertEqual(out[3].shape, torch.Size([B, 1, S, 512]))
        self.assertEqual(str(out[2].device), "npu:0")
        self.assertEqual(k_cache.device, torch.device("npu", 0))

    @SupportedDevices(['Ascend910_93'])
    def test_skipped_on_a2(self):
        self.fail("gated to Atlas A3")


class TestNzWeightLoadingStyle(TestCase):
    @SupportedDevices(['Ascend910B'])
    def test_format_cast_on_parameters(self):
        layer = nn.Linear(64, 32, bias=False).npu()
        layer.weight.data = torch_npu.npu_format_cast(layer.weight.data, 29)
        self.assertEqual(torch_npu.get_npu_format(layer.weight), 29)
        state = {"weight": torch.randn(32, 64)}
        layer.load_state_dict(state)
        self.assertEqual(torch_npu.get_npu_format(layer.weight), 29)
        self.assertRtolEqual(layer.weight.detach().cpu(), state["weight"])
        cpu_input, npu_input = create_common_tensor([np.float32, 29, (16, 32)], -1, 1)
        self.assertEqual(torch_npu.get_npu_format(npu_input), 29)
        self.assertEqual(npu_input.cpu(), cpu_input, prec=0)
        self.assertTrue(utils.get_cann_version().startswith("8."))
        self.assertEqual(layer.weight.device.type, "npu")
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "weight.pt")
            torch.save(layer.weight, path)
            loaded = torch.load(path)
            self.assertEqual(torch_npu.get_npu_format(loaded), 29)
            self.assertEqual(loaded.device.type, "npu")
            self.assertEqual(loaded.cpu(), state["weight"], prec=0)
            host = torch.load(path, map_location="cpu")
            self.assertEqual(host.device.type, "cpu")
            self.assertEqual(torch_npu.get_npu_format(host), 2)
        g = torch.Generator(device="npu")
        g.manual_seed(1)
        first = torch.randn(8, generator=g, device="npu")
        g.manual_seed(1)
        self.assertEqual(first, torch.randn(8, generator=g, device=first.device), prec=0)


if __name__ == "__main__":
    run_tests()
