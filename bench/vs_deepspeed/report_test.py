#!/usr/bin/env python3
"""The report's verdicts: on two loss curves (Note [Loss spikes] in report.py) and on the
tokens/s targets against the compute limit and the FLOP ceiling (Notes [The compute limit],
[The FLOP ceiling])."""

import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import report  # noqa: E402

STEADY = [5.0, 4.5, 4.0, 3.8, 3.7, 3.6]
NORMS = [10.0, 5.0, 3.0, 2.0, 1.5, 1.2]


def e2e(side, losses, grad_norms=None):
    return {"kind": "e2e", "side": side, "model": "torch_gpt", "placement": "memory", "world": 1,
            "d_model": 512, "losses": losses, "grad_norms": grad_norms or [1.0] * len(losses)}


class LossVerdictTest(unittest.TestCase):
    def test_curves_within_the_tolerance(self):
        zinf = [x * (1 + 1e-6) for x in STEADY]
        self.assertEqual(report.loss_verdict(zinf, STEADY, NORMS), "1.0e-06 (within 1e-3)")

    def test_a_rise_of_the_loss_is_a_spike(self):
        deepspeed = STEADY[:3] + [5.0, 4.0, 3.9]
        zinf = STEADY[:3] + [5.0, 4.4, 3.9]
        self.assertIn("after the spike of step 4; 0.0e+00 before it",
                      report.loss_verdict(zinf, deepspeed, NORMS))

    def test_a_rise_of_the_gradient_norm_alone_is_a_spike(self):
        norms = NORMS[:4] + [30.0, 1.0]
        zinf = STEADY[:4] + [3.8, 3.7]
        verdict = report.loss_verdict(zinf, STEADY, norms)
        self.assertIn("OUTSIDE 1e-3 after the spike of step 5", verdict)
        self.assertIn("OUTSIDE 1e-3", report.loss_verdict(zinf, STEADY, NORMS))
        self.assertNotIn("spike", report.loss_verdict(zinf, STEADY, NORMS))

    def test_a_difference_before_the_spike_fails_the_check(self):
        deepspeed = STEADY[:3] + [5.0, 4.0, 3.9]
        parted_early = [5.0, 4.6] + deepspeed[2:]
        problems = report.check([e2e("zinf", parted_early), e2e("deepspeed", deepspeed)])
        self.assertEqual(len(problems), 1)
        self.assertIn("before the spike of step 4", problems[0])
        parted_after = deepspeed[:4] + [4.4, 3.9]
        self.assertEqual(report.check([e2e("zinf", parted_after), e2e("deepspeed", deepspeed)]),
                         [])

    def test_older_logs_without_gradient_norms(self):
        zinf = STEADY[:4] + [3.8, 3.7]
        self.assertEqual(report.loss_verdict(zinf, STEADY), report.loss_verdict(zinf, STEADY, None))
        self.assertIsNone(report.first_spike(STEADY, NORMS[:2]))


class TargetVerdictTest(unittest.TestCase):
    def test_a_target_above_the_flop_ceiling_says_so(self):
        # DeepSpeed 1,000 tokens/s with parameters on NVMe: the target is 2,000.
        verdict = report.targets("nvme", 1100, 1000, 1, 2, limit=1400, ceiling=1800)
        self.assertEqual(verdict, "2.0x NOT met (the limit is 1.40x; the FLOP ceiling 1.80x "
                                  "< the target), met")
        verdict = report.targets("memory", 1100, 1000, 1, 2, limit=1400, ceiling=1800)
        self.assertEqual(verdict, "1.5x NOT met (the limit is 1.40x; the FLOP ceiling 1.80x), "
                                  "met")
        self.assertEqual(report.targets("memory", 1600, 1000, 3, 2, limit=1700, ceiling=1800),
                         "1.5x met, NOT met")

    def test_the_ceiling_is_the_torch_runs_peak_over_the_models_flops(self):
        torch_run = {"kind": "e2e", "side": "torch", "model": "torch_gpt", "world": 2,
                     "d_model": 512, "layers": 8, "compute_tokens_per_s": 1000.0,
                     "matmul_flops": 180e9, "flops_per_token": 150e6}
        older = dict(torch_run, compute_tokens_per_s=1200.0)
        del older["matmul_flops"], older["flops_per_token"]
        limits = report.compute_limits([torch_run, older])
        self.assertEqual(limits[("torch_gpt", 2, 512, 8, None)], (1100.0, 1200.0))

    def test_each_placement_takes_the_limit_measured_beside_it(self):
        def torch_run(beside, tokens):
            return {"kind": "e2e", "side": "torch", "model": "torch_gpt", "world": 1,
                    "d_model": 256, "layers": 4, "compute_tokens_per_s": tokens,
                    "beside": beside}
        limits = report.compute_limits([torch_run("memory", 4700.0), torch_run("nvme", 5900.0),
                                        torch_run("nvme", 6000.0)])
        self.assertEqual(limits[("torch_gpt", 1, 256, 4, "memory")], (4700.0, None))
        self.assertEqual(limits[("torch_gpt", 1, 256, 4, "nvme")], (5950.0, None))
        self.assertEqual(limits[("torch_gpt", 1, 256, 4, None)], (5900.0, None))


if __name__ == "__main__":
    unittest.main()
