"""The RAGEN-facade rows of ``turnpool bench envs`` (`turnpool.bench.envs`): that turnpool's
room generation stages the same rooms as gym-sokoban's (`stage_identity`), the cost of
frames crossing processes (`measure_visual_transport`) and the facade's start time
(`measure_facade_start`).
"""

from __future__ import annotations

import time
from types import ModuleType
from typing import Any

import numpy as np

VISUAL_ENVS = 1024


def stage_identity(gym: ModuleType | None, seeds: int = 200) -> str:
    """``"k/n"``: rooms whose topology and placement equal gym_sokoban's, fed the same
    local generators (its functions read module globals ``random`` / ``np.random``)."""
    import random

    from turnpool.envs import sokoban_gen

    if gym is None:
        return "-"

    class _Np:
        def __init__(self, rs: np.random.RandomState) -> None:
            self.random = rs

        def __getattr__(self, name: str) -> Any:
            return getattr(np, name)

    same = 0
    for seed in range(seeds):
        steps = sokoban_gen.num_gen_steps(6, 6)
        vars(gym).update(random=random.Random(seed), np=_Np(np.random.RandomState(seed)))
        level = gym.room_topology_generation((6, 6), 0.35, steps)
        floor = sokoban_gen.topology(random.Random(seed), 6, 6, steps)
        try:
            room = gym.place_boxes_and_player(level.copy(), num_boxes=1, second_player=False)
        except RuntimeError:
            room = None
        try:
            player, targets = sokoban_gen.place(np.random.RandomState(seed), floor, 1)
        except sokoban_gen.GenerationFailed:
            same += room is None
            continue
        if room is None:
            continue
        flat = room.ravel()
        same += (bytes(floor) == bytes(level.astype(np.uint8).ravel())
                 and player == int(np.flatnonzero(flat == 5)[0])
                 and targets == tuple(int(p) for p in np.flatnonzero(flat == 2)))
    return f"{same}/{seeds}"


def measure_visual_transport(n_envs: int = VISUAL_ENVS) -> dict[str, Any]:
    """Bytes per step a process worker sends for ``n_envs`` VisualSimpleSokoban envs."""
    import pickle

    from turnpool.envs.sokoban import frame_from_obs, tiles
    from turnpool.worker.build import EnvBuild
    from turnpool.worker.host import EnvHost

    kwargs = {"dim_room": (6, 6), "num_boxes": 1, "render_mode": "rgb_array"}
    host = EnvHost([EnvBuild(i, "turnpool.envs.sokoban:SokobanEnv", kwargs)
                    for i in range(n_envs)])
    host.reset([(10_000 + i, [i]) for i in range(n_envs)])
    ids = list(range(n_envs))
    reply = host.step((ids, [[1 + i % 4] for i in ids]))
    sent = len(pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL))
    tiles()  # loaded once per process; not a per-step cost
    t0 = time.perf_counter()
    frames = [frame_from_obs(r[0]) for r in reply[0]]
    draw_ms = (time.perf_counter() - t0) * 1e3
    frame_bytes = len(pickle.dumps(frames, protocol=pickle.HIGHEST_PROTOCOL))
    host.close()
    # envs that render frames themselves (RAGEN env classes through the adapter): each
    # writes into its own shared-memory slot and only a descriptor is pickled
    from turnpool.envs.frames import FrameReader, FrameSlot

    slots = [FrameSlot() for _ in range(n_envs)]
    reader = FrameReader()
    try:
        descs = [slot.write(f) for slot, f in zip(slots, frames)]
        t0 = time.perf_counter()
        for desc in descs:
            assert desc is not None
            reader.read(desc)
        shm_ms = (time.perf_counter() - t0) * 1e3
        desc_bytes = len(pickle.dumps(descs, protocol=pickle.HIGHEST_PROTOCOL))
        copied = reader.bytes_copied
    finally:
        reader.close()
        for slot in slots:
            slot.close()
    return {"envs": n_envs, "reply_bytes_per_step": sent,
            "pickled_frames_bytes_per_step": frame_bytes, "driver_draw_ms_per_step": draw_ms,
            "shm_descriptor_bytes_per_step": desc_bytes, "shm_bytes_copied_per_step": copied,
            "shm_read_ms_per_step": shm_ms}


_START_SCRIPT = """
import json, sys, time
from turnpool.ragen.state_manager import EnvStateManager
cfg = json.loads(sys.argv[1])
t0 = time.perf_counter()
es = EnvStateManager(cfg)
es.reset()
print(json.dumps(time.perf_counter() - t0))
es.close()
"""


def measure_facade_start() -> dict[str, float]:
    """Seconds for ``EnvStateManager(cfg)`` plus its first ``reset()``, each case in a fresh
    interpreter (a plain script's start: data sets not yet loaded; imports excluded)."""
    import json
    import subprocess
    import sys

    def cfg(backend: str | None, tags: list[str], n_groups: list[int], size: int
            ) -> dict[str, Any]:
        out: dict[str, Any] = {"es_manager": {"train": {
            "env_groups": sum(n_groups), "group_size": size,
            "env_configs": {"tags": tags, "n_groups": n_groups}}}, "seed": {"train": 10000}}
        if backend:
            out["turnpool"] = {"backend": backend}
        return out

    three = (["FrozenLake", "Countdown", "MetamathQA"], [1, 1, 1], 2)
    cases = {"3 tags x 2, default (in-process)": cfg(None, *three),
             "SimpleSokoban 8x16, default (in-process)": cfg(None, ["SimpleSokoban"], [8], 16),
             "3 tags x 2, backend=process": cfg("process", *three)}
    out = {}
    for name, c in cases.items():
        proc = subprocess.run([sys.executable, "-c", _START_SCRIPT, json.dumps(c)],
                              capture_output=True, text=True, timeout=300, check=True)
        out[name] = float(json.loads(proc.stdout.strip().splitlines()[-1]))
    return out
