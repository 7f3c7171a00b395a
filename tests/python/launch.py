"""Running a test script as its users run it: on one process with a launcher's environment
(DeepSpeed's init_distributed wants one), or on several under `zinf run -n N`; and reading the
one "RESULT {json}" line the main process prints."""

import json
import os
import socket
import subprocess

HERE = os.path.dirname(os.path.abspath(__file__))
BUILD_DIR = os.environ.get("ZINF_BUILD_DIR", os.path.join(HERE, "..", "..", "build"))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(test, cmd, world, env=None, expect_ok=True, timeout=500, launcher_env=True):
    """Runs `cmd` (a list) on `world` processes with os.environ updated by `env`; asserts on
    `test` that it exits 0 (or, expect_ok=False, that it fails) and returns its stdout and
    stderr together. One process gets a launcher's environment unless launcher_env is False
    (a script that would then make a torch.distributed group of one)."""
    full_env = dict(os.environ, PYTHONWARNINGS="ignore", **(env or {}))
    if world > 1:
        launcher = os.path.join(BUILD_DIR, "bin", "zinf")
        test.assertTrue(os.path.exists(launcher), f"{launcher} is not built")
        cmd = [launcher, "run", "-n", str(world), "--"] + list(cmd)
    elif launcher_env:
        full_env.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                        MASTER_PORT=str(free_port()))
    done = subprocess.run(cmd, capture_output=True, text=True, env=full_env, timeout=timeout)
    if expect_ok:
        test.assertEqual(done.returncode, 0, f"{cmd}:\n{done.stdout[-4000:]}\n"
                                             f"{done.stderr[-8000:]}")
    else:
        test.assertNotEqual(done.returncode, 0, done.stdout[-2000:])
    return done.stdout + done.stderr


def result(test, output):
    """The RESULT line's JSON: exactly one in `output`."""
    lines = [x for x in output.splitlines() if "RESULT " in x]
    test.assertEqual(len(lines), 1, output[-4000:])
    return json.loads(lines[0].split("RESULT ", 1)[1])
