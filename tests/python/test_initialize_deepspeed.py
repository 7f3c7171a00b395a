"""DeepSpeed itself runs the getting-started loop of tests/python/initialize_train.py (the
same text as under zinf, X = deepspeed) on 1 and 2 processes, and zinf.initialize's run of it
gives DeepSpeed's learning rates, losses (before and after the resume from the checkpoint),
client_state and step count. Skips where deepspeed does not import (Debian's torch 1.13 has
none). Slow: DeepSpeed's CPU backend compiles an extension on its first use."""

import sys
import unittest

from test_initialize import LoopRunner, loop_config


def deepspeed_missing():
    """Why the deepspeed side cannot run here, or None."""
    try:
        import deepspeed  # noqa: F401
    except Exception as e:  # ImportError, or a broken install raising anything
        return f"deepspeed does not import under {sys.executable}: {e}"
    return None


class DeepSpeedTest(LoopRunner):
    def test_deepspeed_runs_the_same_loop_to_the_same_losses(self):
        why = deepspeed_missing()
        if why:
            self.skipTest(why)
        for world in (1, 2):
            with self.subTest(world=world):
                ours = self.run_loop("zinf", world, loop_config())
                theirs = self.run_loop("deepspeed", world, loop_config())
                for a, b in zip(ours, theirs):
                    for got, want in zip(a["lrs"], b["lrs"]):
                        self.assertAlmostEqual(got, want, delta=1e-12, msg="the schedules differ")
                    self.assertEqual(len(a["lrs"]), len(b["lrs"]))
                    for got, want in zip(a["losses"] + a["resumed"],
                                         b["losses"] + b["resumed"]):
                        self.assertAlmostEqual(got, want, delta=2e-5 * abs(want),
                                               msg=f"{a} vs {b}")
                    # DeepSpeed's client_state also holds its own keys.
                    self.assertEqual(a["client_state"]["step"], b["client_state"]["step"])
                    self.assertEqual(a["global_steps"], b["global_steps"])

if __name__ == "__main__":
    unittest.main()
