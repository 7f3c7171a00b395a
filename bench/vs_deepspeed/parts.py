#!/usr/bin/env python3
"""zinf's parts against DeepSpeed's, on the same buffers, interleaved (zinf, DeepSpeed, zinf,
...); each subcommand prints RESULT lines (common.py) that report.py turns into tables.

  adam      zinf.optim.AdamW against deepspeed.ops.adam.DeepSpeedCPUAdam: --params elements in
            --tensors parameters (default one; a model has many, and each costs both optimizers
            some Python per step), their gradients and moments shared by both optimizers (each
            steps the same tensors in turn), --threads threads each (zinf's threads argument;
            DeepSpeed's OpenMP loop reads OMP_NUM_THREADS, which the caller sets); --load N runs
            N other processes (a busy loop each) beside both, as on a shared node. A sample is
            at least 64M parameters' worth of steps, so an in-cache size times many. The memory
            bandwidth limit comes from `zinf bench adam`, run by the caller in the same loop.
  aio       zinf.nvme.SwapHandle against DeepSpeed's aio_handle and fio, write then read of
            --size bytes in --dir, from and into one page-locked buffer that both handles use
            (DeepSpeed's new_cpu_locked_tensor), moved onto 2 MiB pages as fio's buffers are
            (see fio()), and on one file: the handle's swap file, which DeepSpeed and fio open
            by its /proc path (Note [One file for every side]). Both get DeepSpeed's documented
            "aio" defaults (1 MiB blocks, queue depth 8); fio gets the same block size, depth,
            size and O_DIRECT. Then both handles again on an ordinary tensor, as a user passes
            one: torch's allocator's, 64-byte aligned and pageable, which each side moves
            through page-aligned memory of its own.
            And zinf's store (`zinf bench nvme`) moving the same bytes through a buffer of fio's
            size (block x depth) and through one of --size: fio's buffers are a few MiB, the
            handles' is the whole tensor, and on a virtual disk that changes the rate.
  estimate  DeepSpeed's ZeRO-3 memory estimator for the GPT of train.py against `zinf plan`.

Run with DS_ACCELERATOR=cpu and the benchmark's virtualenv (bench/vs_deepspeed.sh does both).
"""

import argparse
import contextlib
import ctypes
import json
import os
import subprocess
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import common  # noqa: E402


def parse_size(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper()
    if text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


# -- CPU Adam ----------------------------------------------------------------------------------

ADAM_HYPER = dict(lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)


@contextlib.contextmanager
def busy_processes(count):
    """`count` other processes spinning on the CPU while the block runs."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


def adam(args):
    import zinf.optim
    from deepspeed.ops.adam import DeepSpeedCPUAdam

    n = parse_size(args.params)
    if not 1 <= args.tensors <= n:
        raise SystemExit(f"--tensors must be in [1, --params], got {args.tensors}")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    sizes = [n // args.tensors + (i < n % args.tensors) for i in range(args.tensors)]
    params = [torch.nn.Parameter(torch.randn(k) * 0.02) for k in sizes]
    ours = zinf.optim.AdamW(params, threads=args.threads, workers=args.workers, **ADAM_HYPER)
    theirs = DeepSpeedCPUAdam(params, adamw_mode=True, **ADAM_HYPER)
    for param in params:
        param.grad = torch.randn(param.numel()) * 1e-3
        exp_avg, exp_avg_sq = torch.zeros(param.numel()), torch.zeros(param.numel())
        ours.state[param] = {"step": torch.zeros(()), "exp_avg": exp_avg,
                             "exp_avg_sq": exp_avg_sq}
        theirs.state[param] = {"step": 0, "exp_avg": exp_avg, "exp_avg_sq": exp_avg_sq}

    steps_per_sample = max(1, (64 << 20) // n)
    # In training the step follows backward's last torch ops, whose OpenMP threads keep
    # spinning on the cores for a while after each op (libgomp's default wait policy).
    # DeepSpeedCPUAdam runs on those same threads; zinf's oneTBB workers compete with them.
    after_op = torch.randn(1 << 20) if args.after_torch_op else None

    def timed(opt):
        total = 0.0
        for _ in range(steps_per_sample):
            if after_op is not None:
                after_op.mul_(1.0001)  # OpenMP-parallel on torch's threads
            t0 = time.perf_counter()
            opt.step()
            total += time.perf_counter() - t0
        return total / steps_per_sample

    # First touch, thread pools, DeepSpeed's op table; and zinf's store-mode tuning, which
    # takes turns over cached and streaming stores, each with and without software prefetch,
    # for its first 20 large steps and then keeps the fastest (Note [Store mode tuning]): what
    # training runs at is the mode it settles on. Both sides get the same warm-up steps.
    # The default workers' rows are side "zinf"; the other pool's, a side of their own.
    ours_name = "zinf" if args.workers == "openmp" else f"zinf ({args.workers} workers)"
    times = {ours_name: [], "deepspeed": []}
    with busy_processes(args.load):
        for _ in range(21):
            ours.step(), theirs.step()
        for _ in range(args.reps):
            times[ours_name].append(timed(ours))
            times["deepspeed"].append(timed(theirs))
    bytes_per_step = 28 * n  # reads p, g, m, v; writes p, m, v (fp32)
    for side, runs in times.items():
        step_s = common.median(runs)
        common.emit("adam", side=side, params=n, tensors=args.tensors, threads=args.threads,
                    load=args.load, after_torch_op=args.after_torch_op,
                    step_s=step_s,
                    runs_s=runs, GBps=bytes_per_step / step_s / 1e9,
                    omp_num_threads=os.environ.get("OMP_NUM_THREADS", ""),
                    workers=ours.workers if side == ours_name else "OpenMP",
                    isa=ours.isa if side == ours_name else "DeepSpeed's build (-march=native)")


# -- Async I/O ---------------------------------------------------------------------------------

AIO = dict(block_size=1 << 20, queue_depth=8)  # DeepSpeed's documented "aio" defaults


def fio_has_huge_pages():
    """Whether fio's buffers (a block per request in flight) fit in the reserved 2 MiB pages."""
    with open("/proc/sys/vm/nr_hugepages") as f:
        return int(f.read()) * (2 << 20) >= AIO["block_size"] * AIO["queue_depth"]


def fio(rw, path, size, fio_bin):
    cmd = [fio_bin, "--ioengine=io_uring", "--direct=1", f"--rw={rw}",
           f"--bs={AIO['block_size']}", f"--iodepth={AIO['queue_depth']}", f"--size={size}",
           "--output-format=json", "--name=vs-deepspeed", f"--filename={path}"]
    # Buffers on 2 MiB pages where the machine has them, as zinf's staging is: on a virtio
    # disk a 1 MiB request on 4 KiB pages is split, and fio then runs at a third of the rate
    # (bench/RESULTS.md, "The disk behind the cache").
    if fio_has_huge_pages():
        cmd.append("--iomem=mmaphuge")
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    job = json.loads(out[out.index("{"):])["jobs"][0]
    direction = "read" if rw == "read" else "write"
    return size / (job[direction]["runtime"] / 1e3)  # bytes per second


def onto_huge_pages(tensor):
    """Moves `tensor`'s memory onto 2 MiB pages in place (madvise MADV_HUGEPAGE, then
    MADV_COLLAPSE: Linux 6.1 and later) and returns the share of it that is on them now."""
    align, size = 2 << 20, tensor.numel() * tensor.element_size()

    def anon_huge():
        with open("/proc/self/smaps_rollup") as f:
            return next(int(line.split()[1]) << 10 for line in f
                        if line.startswith("AnonHugePages:"))

    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    first = -(-tensor.data_ptr() // align) * align
    last = (tensor.data_ptr() + size) // align * align
    before = anon_huge()
    if last > first:
        for advice in (14, 25):  # MADV_HUGEPAGE, MADV_COLLAPSE; a kernel without either refuses
            libc.madvise(first, last - first, advice)
    return min(1.0, (anon_huge() - before) / size)


def store_rates(args, size, buffer_bytes):
    """zinf's swap store writing then reading `size` bytes through `buffer_bytes` of 2 MiB-page
    staging (`zinf bench nvme`): (write, read) in bytes per second."""
    out = subprocess.run([args.zinf, "bench", "nvme", "--path", args.dir, "--size", str(size),
                          "--staging", str(buffer_bytes), "--reps", "1", "--no-fio",
                          "--fio-huge-pages", "--json"],
                         check=True, capture_output=True, text=True).stdout
    j = json.loads(out)
    return j["write_MBps"] * 1e6, j["read_MBps"] * 1e6


# Note [One file for every side]
# Where a file lies on a virtual disk changes its rate: fio read two 1 GiB files made one after
# the other, in the same run and interleaved, at 5.65 and 6.23 GB/s (2 MiB pages), and on 4 KiB
# pages another pair at 5.93 and 5.74. So DeepSpeed's handle and fio read and write zinf's
# swap file itself, opened by its /proc path (the handle unlinks its files once open). Every
# write phase ends with zinf's then DeepSpeed's write of the same tensor, so the file holds
# what zinf wrote last and zinf's checksums still hold whenever fio's write (its own bytes) came.


def swap_file_of(open_handle, directory):
    """The /proc path of the swap file that `open_handle()` opens in `directory`, and the
    handle: the one descriptor of an unlinked file there that the call added."""
    def unlinked():
        found = set()
        for fd in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError):  # the listing's own descriptor is gone by now
                target = os.readlink(f"/proc/self/fd/{fd}")
                if target.startswith(directory) and target.endswith(" (deleted)"):
                    found.add(fd)
        return found

    before = unlinked()
    handle = open_handle()
    added = unlinked() - before
    assert len(added) == 1, f"expected one new swap file in {directory}, found {sorted(added)}"
    return f"/proc/{os.getpid()}/fd/{added.pop()}", handle


def aio(args):
    import zinf.nvme
    from deepspeed.ops.op_builder import AsyncIOBuilder

    size = parse_size(args.size)
    ds = AsyncIOBuilder().load().aio_handle(AIO["block_size"], AIO["queue_depth"], False, True, 1)
    # DeepSpeed's page-locked tensor (any other buffer it copies through one of its own), on
    # the page size fio's buffers have (fio()).
    buffer = ds.new_cpu_locked_tensor(size, torch.empty(0, dtype=torch.uint8))
    assert buffer.data_ptr() % 4096 == 0, "DeepSpeed's locked tensor is not page-aligned"
    huge = onto_huge_pages(buffer) if fio_has_huge_pages() else 0.0
    buffer.copy_(torch.randint(0, 256, (size,), dtype=torch.uint8))
    directory = os.path.realpath(args.dir)
    shared_file, ours = swap_file_of(lambda: zinf.nvme.SwapHandle(directory, size, **AIO),
                                     directory)
    # Also without checksums, the work DeepSpeed does: zinf's default checks a CRC32C of
    # every piece. This handle has a file of its own: its row is zinf's alone.
    plain = zinf.nvme.SwapHandle(directory, size, checksum=False, **AIO)
    ours.pwrite(buffer, "t")
    check = torch.empty_like(buffer)
    ds.async_pread(check, shared_file)
    assert ds.wait() >= 1 and torch.equal(check, buffer), \
        f"{shared_file} does not hold the tensor zinf wrote from its first byte"
    del check

    ordinary = torch.randint(0, 256, (size,), dtype=torch.uint8)
    ordinary_alignment = next(a for a in (4096, 2048, 1024, 512, 256, 128, 64, 32, 16, 8, 4, 2, 1)
                              if ordinary.data_ptr() % a == 0)

    def zinf_write(handle=ours, tensor=buffer):
        handle.pwrite(tensor, "t")

    def zinf_read(handle=ours, tensor=buffer):
        handle.pread(tensor, "t")

    def ds_write(tensor=buffer):
        ds.async_pwrite(tensor, shared_file)
        assert ds.wait() >= 1

    def ds_read(tensor=buffer):
        ds.async_pread(tensor, shared_file)
        assert ds.wait() >= 1

    def rate(fn):
        t0 = time.perf_counter()
        fn()
        return size / (time.perf_counter() - t0)

    small_buffer = AIO["block_size"] * AIO["queue_depth"]  # fio's
    sides = ("zinf", "zinf without checksums", "deepspeed", "fio", "zinf, ordinary tensor",
             "deepspeed, ordinary tensor", "zinf store, fio's buffer size",
             "zinf store, the whole size")
    rates = {(side, rw): [] for side in sides for rw in ("write", "read")}
    # On this disk a 1 GiB write slows the next one (the host writes it back): whoever writes
    # right after fio or another handle pays for it. So the four sides take turns at going
    # first, in reads as in writes; with --reps a multiple of 4 each takes each place equally.
    sides_in_turn = [("fio", lambda rw, *_: fio(rw, shared_file, size, args.fio)),
                     ("zinf", lambda rw, zfn, dfn: rate(zfn)),
                     ("zinf without checksums", lambda rw, zfn, dfn: rate(lambda: zfn(plain))),
                     ("deepspeed", lambda rw, zfn, dfn: rate(dfn))]
    try:
        zinf_write(plain)  # allocates its file
        for rep in range(args.reps):
            turn = sides_in_turn[rep % 4:] + sides_in_turn[:rep % 4]
            for rw, zfn, dfn in (("write", zinf_write, ds_write), ("read", zinf_read, ds_read)):
                for side, run in turn:
                    rates[(side, rw)].append(run(rw, zfn, dfn))
                # Then the ordinary tensor, zinf's turn before DeepSpeed's: writing, both write
                # its bytes last, so the file holds what zinf wrote last, whenever fio wrote.
                rates[("zinf, ordinary tensor", rw)].append(rate(lambda: zfn(tensor=ordinary)))
                rates[("deepspeed, ordinary tensor", rw)].append(
                    rate(lambda: dfn(tensor=ordinary)))
        # After the handles, not among them: each `zinf bench nvme` deletes a swap file of
        # --size, and while the disk takes the discards (/work is mounted with discard) the next
        # 1 GiB write ran at 0.6-3.1 GB/s instead of 5.7-6.0.
        for _ in range(args.reps if args.zinf else 0):
            for side, buffer_bytes in (("zinf store, fio's buffer size", small_buffer),
                                       ("zinf store, the whole size", size)):
                w, r = store_rates(args, size, buffer_bytes)
                rates[(side, "write")].append(w)
                rates[(side, "read")].append(r)
    finally:
        ours.close()
        plain.close()
    ordinary_buffer = f"ordinary torch tensor, {ordinary_alignment}-byte aligned"
    buffers = {
        "fio": f"fio's own, on {'2 MiB' if fio_has_huge_pages() else '4 KiB'} pages",
        "zinf, ordinary tensor": ordinary_buffer,
        "deepspeed, ordinary tensor": ordinary_buffer,
        "zinf store, fio's buffer size":
            f"zinf bench nvme's staging, {small_buffer >> 20} MiB, 2 MiB pages",
        "zinf store, the whole size": f"zinf bench nvme's staging, {size >> 20} MiB, 2 MiB pages",
    }
    own_files = {"zinf without checksums": "its own swap file",
                 "zinf store, fio's buffer size": "zinf bench nvme's own",
                 "zinf store, the whole size": "zinf bench nvme's own"}
    for (side, rw), runs in rates.items():
        if not runs:
            continue
        common.emit("aio", side=side, rw=rw, size=size, GBps=common.median(runs) / 1e9,
                    runs_GBps=[r / 1e9 for r in runs], **AIO,
                    buffer=buffers.get(side, f"shared, {huge:.0%} on 2 MiB pages"),
                    file=own_files.get(side, "zinf's swap file, shared"))


# -- Memory estimator --------------------------------------------------------------------------

# DeepSpeed's estimator's (cpu_offload, cpu_offload_params) for each placement of train.py; it
# has no NVMe case: "nvme" is estimated as parameters and optimizer offloaded to the CPU.
ESTIMATOR_CASES = {"memory": (False, False), "cpu": (True, False), "nvme": (True, True)}
# zinf plan's placement row for each.
PLAN_ROWS = {"memory": "param none, optim none, fp32", "cpu": "param none, optim cpu, fp32",
             "nvme": "param nvme, optim nvme, fp32"}


def estimate(args):
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    import train

    model = train.build_model(args)
    total = sum(p.numel() for p in model.parameters())
    largest = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())
    config = {"model": {"vocab_size": 256, "seq_len": args.seq, "d_model": args.d_model,
                        "n_layer": args.layers, "n_head": args.heads},
              "train_micro_batch_size_per_gpu": args.micro, "zero_optimization": {"stage": 3}}
    config_path = os.path.join(args.work_dir, "plan-model.json")
    with open(config_path, "w") as f:
        json.dump(config, f)
    plan = json.loads(subprocess.run(
        [args.zinf, "plan", "--model", config_path, "--world-size", str(args.world), "--json"],
        check=True, capture_output=True, text=True).stdout)
    rows = {row["placement"]: row for row in plan["placements"]}
    for placement, (offload, offload_params) in ESTIMATOR_CASES.items():
        # zero_init=False: train.py builds the model whole on every rank, as zinf's does.
        cpu, gpu, _ = estimate_zero3_model_states_mem_needs(
            total, largest, num_gpus_per_node=args.world, cpu_offload=offload,
            cpu_offload_params=offload_params, zero_init=False)
        row = rows.get(PLAN_ROWS[placement], {})
        # On the CPU accelerator the "GPU" memory is host memory too: the node needs both. So
        # too for zinf: its device tier, host tier and activations, per rank, all in memory.
        per_rank = [row.get(k) for k in ("peak_device_bytes", "peak_host_bytes",
                                         "activation_bytes")]
        common.emit("estimate", placement=placement, world=args.world, params=total,
                    d_model=args.d_model, layers=args.layers,
                    deepspeed_host_bytes=cpu + gpu * args.world,
                    zinf_plan_node_bytes=(sum(per_rank) * args.world
                                          if None not in per_rank else None),
                    zinf_plan_nvme_bytes=row.get("nvme_bytes"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    a = sub.add_parser("adam")
    a.add_argument("--params", default="64M")
    a.add_argument("--tensors", type=int, default=1, help="parameters --params is split into")
    a.add_argument("--threads", type=int, default=1)
    a.add_argument("--load", type=int, default=0, help="other busy processes beside the step")
    a.add_argument("--workers", choices=("openmp", "onetbb"), default="openmp",
                   help="zinf.optim's workers (Note [Whose threads] in cpu_optim/parallel.h)")
    a.add_argument("--reps", type=int, default=5)
    a.add_argument("--after-torch-op", action="store_true",
                   help="each step right after a parallel torch op, as after backward")
    a.set_defaults(fn=adam)
    a = sub.add_parser("aio")
    a.add_argument("--dir", required=True)
    a.add_argument("--size", default="1G")
    a.add_argument("--reps", type=int, default=3)
    a.add_argument("--fio", default="fio")
    a.add_argument("--zinf", default="", help="the zinf command line, for its store's rows")
    a.set_defaults(fn=aio)
    a = sub.add_parser("estimate")
    import train
    train.add_model_args(a)
    a.add_argument("--world", type=int, default=1)
    a.add_argument("--zinf", required=True, help="the zinf command line")
    a.add_argument("--work-dir", required=True)
    a.set_defaults(fn=estimate)
    args = ap.parse_args()
    args.fn(args)


if __name__ == "__main__":
    main()
