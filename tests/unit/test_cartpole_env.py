"""The C cart-pole of cartpole-reinforce against gymnasium's CartPole-v1.

The environment source (c/models/cartpole-reinforce/cartpole_env.c) is
compiled natively into a shared library with the model's floating-point
flags (-ffp-contract=off: IEEE double operations give the same bits in
wasm32 and x86-64) and driven through ctypes from the same states and
actions as gymnasium.
"""

from __future__ import annotations

import ctypes
import math
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

gym = pytest.importorskip("gymnasium")

ROOT = Path(__file__).resolve().parents[2]
ENV_DIR = ROOT / "c" / "models" / "cartpole-reinforce"

SHIM = r"""
#include "cartpole_env.h"
void t_seed(weei_rng *r, unsigned long long seed) { weei_rng_seed(r, seed); }
void t_sincos(double x, double *s, double *c) { weei_sincos(x, s, c); }
"""


class State(ctypes.Structure):
    _fields_ = [("x", ctypes.c_double), ("x_dot", ctypes.c_double), ("theta", ctypes.c_double), ("theta_dot", ctypes.c_double)]

    def as_array(self) -> np.ndarray:
        return np.array([self.x, self.x_dot, self.theta, self.theta_dot])


class Rng(ctypes.Structure):
    _fields_ = [("s", ctypes.c_uint64 * 4)]


@pytest.fixture(scope="module")
def lib(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    if shutil.which("clang") is None:
        pytest.skip("clang is not installed (make setup installs it)")
    tmp = tmp_path_factory.mktemp("cartpole-env")
    (tmp / "shim.c").write_text(SHIM)
    so = tmp / "libcartpole.so"
    subprocess.run(
        ["clang", "-O2", "-ffp-contract=off", "-fno-math-errno", "-shared", "-fPIC", f"-I{ENV_DIR}",
         "-o", str(so), str(ENV_DIR / "cartpole_env.c"), str(tmp / "shim.c")],
        check=True,
    )
    lib = ctypes.CDLL(str(so))
    lib.cp_step.argtypes = [ctypes.POINTER(State), ctypes.c_int]
    lib.cp_step.restype = ctypes.c_int
    lib.cp_reset.argtypes = [ctypes.POINTER(State), ctypes.POINTER(Rng)]
    lib.cp_observe.argtypes = [ctypes.POINTER(State), ctypes.POINTER(ctypes.c_float * 4)]
    lib.t_seed.argtypes = [ctypes.POINTER(Rng), ctypes.c_ulonglong]
    lib.t_sincos.argtypes = [ctypes.c_double, ctypes.POINTER(ctypes.c_double), ctypes.POINTER(ctypes.c_double)]
    return lib


def c_step(lib: ctypes.CDLL, state: np.ndarray, action: int) -> tuple[np.ndarray, bool]:
    s = State(*state)
    terminated = lib.cp_step(ctypes.byref(s), action)
    return s.as_array(), bool(terminated)


def gym_step(env: object, state: np.ndarray, action: int) -> tuple[np.ndarray, np.ndarray, float, bool, bool]:
    env.unwrapped.state = np.array(state, dtype=np.float64)
    obs, reward, terminated, truncated, _ = env.step(action)
    return np.array(env.unwrapped.state, dtype=np.float64), obs, reward, terminated, truncated


def test_sincos_matches_math(lib: ctypes.CDLL) -> None:
    s, c = ctypes.c_double(), ctypes.c_double()
    for x in np.concatenate([np.linspace(-12.0, 12.0, 4001), [0.0, 1e-300, -0.21, 0.2094395102393195]]):
        lib.t_sincos(float(x), ctypes.byref(s), ctypes.byref(c))
        assert s.value == pytest.approx(math.sin(x), abs=2e-16 * max(1.0, abs(x)))
        assert c.value == pytest.approx(math.cos(x), abs=2e-16 * max(1.0, abs(x)))


def test_single_steps_match_gymnasium(lib: ctypes.CDLL) -> None:
    env = gym.make("CartPole-v1").unwrapped  # no time limit: states are set by hand
    env.reset(seed=0)
    rng = np.random.default_rng(1)
    # States inside the bounds, near them and beyond (terminated on arrival).
    states = rng.uniform([-2.6, -3.0, -0.25, -3.5], [2.6, 3.0, 0.25, 3.5], size=(2000, 4))
    for state in states:
        for action in (0, 1):
            want, obs, reward, terminated, truncated = gym_step(env, state, action)
            env.unwrapped.steps_beyond_terminated = None
            got, got_terminated = c_step(lib, state, action)
            np.testing.assert_allclose(got, want, rtol=1e-14, atol=1e-15)
            assert got_terminated == terminated
            assert reward == 1.0 and not truncated
            observed = (ctypes.c_float * 4)()
            lib.cp_observe(ctypes.byref(State(*got)), ctypes.byref(observed))
            np.testing.assert_allclose(np.array(observed, dtype=np.float32), obs, rtol=1e-6, atol=1e-7)


def test_trajectories_match_gymnasium(lib: ctypes.CDLL) -> None:
    env = gym.make("CartPole-v1")
    rng = np.random.default_rng(2)
    steps = 0
    for episode in range(50):
        env.reset(seed=episode)
        c_state = np.array(env.unwrapped.state, dtype=np.float64)
        while True:
            action = int(rng.integers(2))
            # mostly alternate actions so some episodes run long
            if rng.random() < 0.7:
                action = steps % 2
            _, _, terminated, truncated, _ = env.step(action)
            c_state, c_terminated = c_step(lib, c_state, action)
            steps += 1
            np.testing.assert_allclose(c_state, env.unwrapped.state, rtol=1e-9, atol=1e-12)
            assert c_terminated == terminated, (episode, steps, c_state)
            if terminated or truncated:
                break
    assert steps > 500


def test_reset_is_uniform_in_range_and_seeded(lib: ctypes.CDLL) -> None:
    def resets(seed: int, n: int) -> np.ndarray:
        r = Rng()
        lib.t_seed(ctypes.byref(r), seed)
        out = []
        for _ in range(n):
            s = State()
            lib.cp_reset(ctypes.byref(s), ctypes.byref(r))
            out.append(s.as_array())
        return np.array(out)

    a = resets(7, 4000)
    assert a.min() >= -0.05 and a.max() < 0.05
    assert np.all(np.abs(a.mean(axis=0)) < 0.003)
    assert np.all(np.abs(a.std(axis=0) - 0.1 / math.sqrt(12)) < 0.002)
    np.testing.assert_array_equal(a, resets(7, 4000))
    assert not np.array_equal(a[:10], resets(8, 10))
