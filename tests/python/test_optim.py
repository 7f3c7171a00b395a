"""zinf.optim against torch.optim: the same numbers step by step, param groups, hyper-parameters
changed between steps, state_dict both ways, the bf16 copy, and bad input."""

import unittest

import torch

import zinf
import zinf.optim as zoptim

# Elementwise fp32 kernels against torch's multi-pass fp32 ops: they may differ by rounding
# (fused multiply-adds, division order), a few ulps a step.
RTOL, ATOL = 2e-5, 2e-6
SIZES = (1, 7, 16, 1000, 4099, 70000)  # tails of every vector width, and a multi-chunk one


def make_params(seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(n, generator=g)) for n in SIZES]


def clone_params(params):
    return [torch.nn.Parameter(p.detach().clone()) for p in params]


def set_grads(a, b, step):
    g = torch.Generator().manual_seed(1000 + step)
    for pa, pb in zip(a, b):
        grad = torch.randn(pa.shape, generator=g)
        pa.grad = grad.clone()
        pb.grad = grad.clone()


def lion_reference_step(params, state, lr, betas, weight_decay):
    b1, b2 = betas
    with torch.no_grad():
        for p in params:
            m = state.setdefault(p, torch.zeros_like(p))
            p.mul_(1 - lr * weight_decay)
            update = (m * b1 + p.grad * (1 - b1)).sign_()
            p.add_(update, alpha=-lr)
            m.mul_(b2).add_(p.grad, alpha=1 - b2)


class OptimTest(unittest.TestCase):
    def assert_params_close(self, a, b, msg=""):
        for i, (pa, pb) in enumerate(zip(a, b)):
            torch.testing.assert_close(pa.detach(), pb.detach(), rtol=RTOL, atol=ATOL,
                                       msg=lambda m: f"{msg} param {i}: {m}")

    def check_against_torch(self, zinf_cls, torch_cls, kwargs_a, kwargs_b, changes, isa="auto",
                            **defaults):
        base = make_params(0)
        pa, pb = clone_params(base), clone_params(base)
        za = zinf_cls([{"params": pa[:3], **kwargs_a}, {"params": pa[3:], **kwargs_b}], isa=isa,
                      **defaults)
        tb = torch_cls([{"params": pb[:3], **kwargs_a}, {"params": pb[3:], **kwargs_b}],
                       **defaults)
        for step in range(12):
            if step in changes:  # a schedule changing hyper-parameters between steps
                for opt in (za, tb):
                    opt.param_groups[1].update(changes[step])
            set_grads(pa, pb, step)
            za.step()
            tb.step()
            self.assert_params_close(pa, pb, f"{zinf_cls.__name__} isa {isa} step {step}")
            # The arguments moved: the test would not notice a kernel that did nothing.
            self.assertFalse(torch.equal(pa[5].detach(), base[5].detach()))
        return za, tb, pa, pb

    def test_adamw_matches_torch_on_every_isa(self):
        for isa in zinf.supported_isas():
            with self.subTest(isa=isa):
                self.check_against_torch(
                    zoptim.AdamW, torch.optim.AdamW, dict(lr=1e-2, weight_decay=0.1),
                    dict(lr=3e-3, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.0),
                    {4: dict(lr=1e-3), 8: dict(betas=(0.9, 0.95), weight_decay=0.05)}, isa=isa)

    def test_both_workers_give_the_same_bits(self):
        # Note [Whose threads]: torch's OpenMP team (the default) or a oneTBB pool of zinf's own;
        # 2M elements in 128 tensors are enough chunks that both pools' threads take part.
        g = torch.Generator().manual_seed(3)
        base = [torch.randn(n, generator=g) for n in [16384 * 64, 7] + [8191] * 126]
        # A torch built on OpenMP brings its runtime into the process; one built on another
        # thread pool leaves none to find, and "openmp" falls back to oneTBB.
        torch_openmp = "parallel backend: OpenMP" in torch.__config__.parallel_info()
        results = {}
        for workers in ("openmp", "onetbb"):
            params = [torch.nn.Parameter(b.clone()) for b in base]
            opt = zoptim.AdamW(params, lr=1e-2, weight_decay=0.1, threads=2, workers=workers)
            self.assertEqual(opt.workers, workers if torch_openmp else "onetbb")
            self.assertEqual(opt.threads, 2)
            for step in range(3):
                gs = torch.Generator().manual_seed(100 + step)
                for p in params:
                    p.grad = torch.randn(p.shape, generator=gs)
                opt.step()
            results[workers] = [p.detach().clone() for p in params]
        for a, b in zip(results["openmp"], results["onetbb"]):
            self.assertTrue(torch.equal(a, b))
        self.assertFalse(torch.equal(results["openmp"][0], base[0]))
        self.assertEqual(zoptim.AdamW([torch.nn.Parameter(base[1])]).threads,
                         torch.get_num_threads())
        with self.assertRaisesRegex(ValueError, "workers must be 'openmp' or 'onetbb'"):
            zoptim.AdamW([torch.nn.Parameter(base[1])], workers="tbb")

    def test_adam_matches_torch(self):
        self.check_against_torch(
            zoptim.Adam, torch.optim.Adam, dict(lr=1e-2, weight_decay=0.1),
            dict(lr=3e-3, betas=(0.8, 0.99), weight_decay=0.0), {5: dict(lr=1e-3)})

    def test_adagrad_matches_torch(self):
        self.check_against_torch(
            zoptim.Adagrad, torch.optim.Adagrad,
            dict(lr=1e-1, lr_decay=0.01, weight_decay=0.1), dict(lr=3e-2, eps=1e-8),
            {6: dict(lr=1e-2, weight_decay=0.01)},
            # torch 1.13 fills every group's sum from the constructor's value, whatever a
            # group says; zinf honours a group's own value, so the test sets it once.
            initial_accumulator_value=0.1)

    def test_lion_matches_the_formula(self):
        base = make_params(1)
        pa, pb = clone_params(base), clone_params(base)
        za = zoptim.Lion(pa, lr=1e-3, betas=(0.9, 0.99), weight_decay=0.1)
        state = {}
        for step in range(10):
            set_grads(pa, pb, step)
            za.step()
            lion_reference_step(pb, state, 1e-3, (0.9, 0.99), 0.1)
            self.assert_params_close(pa, pb, f"lion step {step}")
        for p, q in zip(pa, pb):
            torch.testing.assert_close(za.state[p]["exp_avg"], state[q], rtol=RTOL, atol=ATOL)

    def test_state_dict_moves_between_torch_and_zinf(self):
        base = make_params(2)
        pa, pb = clone_params(base), clone_params(base)
        za = zoptim.AdamW(pa, lr=1e-2, weight_decay=0.1)
        tb = torch.optim.AdamW(pb, lr=1e-2, weight_decay=0.1)
        for step in range(4):
            set_grads(pa, pb, step)
            za.step()
            tb.step()
        # Swap optimizers through their state dicts: torch continues from zinf's, and back.
        za2 = zoptim.AdamW(pb, lr=1.0)
        za2.load_state_dict(tb.state_dict())
        tb2 = torch.optim.AdamW(pa, lr=1.0)
        tb2.load_state_dict(za.state_dict())
        self.assertEqual(za2.param_groups[0]["lr"], 1e-2)
        for step in range(4, 8):
            set_grads(pa, pb, step)
            tb2.step()
            za2.step()
            self.assert_params_close(pa, pb, f"after the swap, step {step}")
        self.assertEqual(int(za2.state[pb[0]]["step"]), 8)

    def test_bf16_copy_is_written_in_the_same_pass(self):
        p = torch.nn.Parameter(torch.randn(4099))
        opt = zoptim.AdamW([p], lr=1e-2, param_copy_dtype=torch.bfloat16)
        for step in range(3):
            p.grad = torch.randn(4099)
            opt.step()
            copy = opt.param_copy(p)
            self.assertEqual(copy.dtype, torch.bfloat16)
            self.assertTrue(torch.equal(copy, p.detach().to(torch.bfloat16)), f"step {step}")

    def test_grad_scale_and_closure(self):
        base = make_params(3)
        pa, pb = clone_params(base), clone_params(base)
        za = zoptim.Adam(pa, lr=1e-2)
        tb = torch.optim.Adam(pb, lr=1e-2)
        set_grads(pa, pb, 0)
        for p in pb:
            p.grad.mul_(0.25)
        self.assertEqual(za.step(closure=lambda: 3.5, grad_scale=0.25), 3.5)
        tb.step()
        self.assert_params_close(pa, pb, "grad_scale 0.25")

    def test_parameters_without_gradients_are_left_alone(self):
        a, b = torch.nn.Parameter(torch.ones(10)), torch.nn.Parameter(torch.ones(10))
        opt = zoptim.AdamW([a, b])
        a.grad = torch.ones(10)
        opt.step()
        self.assertTrue(torch.equal(b.detach(), torch.ones(10)))
        self.assertNotIn(b, opt.state)
        self.assertFalse(torch.equal(a.detach(), torch.ones(10)))

    def test_bad_input_is_a_clear_error(self):
        with self.assertRaisesRegex(ValueError, "learning rate"):
            zoptim.AdamW([torch.nn.Parameter(torch.ones(2))], lr=-1)
        with self.assertRaisesRegex(ValueError, "isa must be"):
            zoptim.AdamW([torch.nn.Parameter(torch.ones(2))], isa="avx9000")
        with self.assertRaisesRegex(ValueError, "param_copy_dtype"):
            zoptim.AdamW([torch.nn.Parameter(torch.ones(2))], param_copy_dtype=torch.int8)

        p = torch.nn.Parameter(torch.ones(4, dtype=torch.float64))
        p.grad = torch.ones(4, dtype=torch.float64)
        with self.assertRaisesRegex(ValueError, r"params'\]\[0\] must be torch.float32"):
            zoptim.AdamW([p]).step()

        p = torch.nn.Parameter(torch.ones(4, 4).t())
        p.grad = torch.ones(4, 4).t()
        with self.assertRaisesRegex(ValueError, "contiguous"):
            zoptim.AdamW([p]).step()

        p = torch.nn.Parameter(torch.ones(4))
        p.grad = torch.ones(4)
        # Options zinf does not implement are refused when the optimizer is made (or a group
        # added), not at the first step.
        for make in (lambda: zoptim.AdamW([p], amsgrad=True),
                     lambda: zoptim.Adam([p], maximize=True),
                     lambda: zoptim.Adagrad([p], maximize=True),
                     lambda: zoptim.AdamW([{"params": [p], "amsgrad": True}])):
            with self.assertRaisesRegex(ValueError, "does not implement (amsgrad|maximize)"):
                make()
        opt = zoptim.AdamW([p])
        with self.assertRaisesRegex(ValueError, "does not implement maximize"):
            opt.add_param_group({"params": [torch.nn.Parameter(torch.ones(2))],
                                 "maximize": True})
        opt = zoptim.AdamW([p])
        opt.param_groups[0]["betas"] = (1.5, 0.9)
        with self.assertRaises(zinf.InvalidArgumentError) as ctx:
            opt.step()
        self.assertIn("beta1", str(ctx.exception))
        self.assertTrue(torch.equal(p.detach(), torch.ones(4)), "a refused step changed p")
        self.assertEqual(float(opt.state[p]["step"]), 0.0, "a refused step was counted")

        opt = zoptim.AdamW([p])
        opt.state[p] = {"step": torch.tensor(0.0), "exp_avg": torch.zeros(3),
                        "exp_avg_sq": torch.zeros(4)}
        with self.assertRaisesRegex(ValueError, r"\('exp_avg'\) has 3 elements, the parameter 4"):
            opt.step()
        # A count kept as a plain number beside a bad array: refused, and nothing changed.
        opt.state[p] = {"step": 5, "exp_avg": torch.zeros(4, dtype=torch.float64),
                        "exp_avg_sq": torch.zeros(4)}
        with self.assertRaisesRegex(ValueError, r"\('exp_avg'\) must be torch.float32"):
            opt.step()
        self.assertEqual(opt.state[p]["step"], 5)
        opt.state[p] = {"step": torch.tensor(0.0), "exp_avg": [0.0] * 4,
                        "exp_avg_sq": torch.zeros(4)}
        with self.assertRaisesRegex(TypeError, r"'exp_avg'\) must be a torch.Tensor, got list"):
            opt.step()
        sparse = torch.nn.Parameter(torch.ones(4))
        sparse.grad = torch.ones(4).to_sparse()
        with self.assertRaisesRegex(ValueError, "sparse gradient"):
            zoptim.AdamW([sparse]).step()
        for bad_count in (-1.0, 2.5, float("nan"), 2.0**24):
            opt.state[p] = {"step": torch.tensor(bad_count), "exp_avg": torch.zeros(4),
                            "exp_avg_sq": torch.zeros(4)}
            with self.assertRaisesRegex(zinf.InvalidArgumentError, "step count must be a whole"):
                opt.step()
            self.assertTrue(torch.equal(p.detach(), torch.ones(4)), f"step count {bad_count}")

    def test_step_counts_kept_as_plain_numbers_continue(self):
        # DeepSpeed's CPU Adam keeps `step` as an int; torch keeps a float32 tensor (a float64
        # one after some conversions). zinf continues from any of them and keeps torch's form.
        for count in (3, 3.0, torch.tensor(3.0, dtype=torch.float64)):
            base = make_params(1)
            pa, pb = clone_params(base), clone_params(base)
            za = zoptim.AdamW(pa, lr=1e-2)
            tb = torch.optim.AdamW(pb, lr=1e-2)
            state = {"exp_avg": torch.full_like(pa[0], 1e-3),
                     "exp_avg_sq": torch.full_like(pa[0], 1e-6)}
            za.state[pa[0]] = {"step": count, **{k: v.clone() for k, v in state.items()}}
            tb.state[pb[0]] = {"step": torch.tensor(3.0), **{k: v.clone() for k, v in state.items()}}
            set_grads(pa, pb, 0)
            za.step()
            tb.step()
            self.assert_params_close(pa, pb, f"from step count {count!r}")
            step = za.state[pa[0]]["step"]
            self.assertEqual((step.dtype, float(step)), (torch.float32, 4.0))


if __name__ == "__main__":
    unittest.main()
