"""State / action normalisation with statistics shipped beside the checkpoint.

Modes (openpi): `mean_std`: (x - mean) / (std + 1e-6); `quantile`: map [q01, q99] to
[-1, 1] with (x - q01) / (q99 - q01 + 1e-6) * 2 - 1 (pi0.5's default); `identity`.
Statistics may cover fewer dims than the padded model vector: extra dims pass through.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

EPS = 1e-6
MODES = ("mean_std", "quantile", "identity")


@dataclass
class Stats:
    mean: np.ndarray | None = None
    std: np.ndarray | None = None
    q01: np.ndarray | None = None
    q99: np.ndarray | None = None

    @classmethod
    def from_dict(cls, d: dict) -> Stats:
        get = lambda k: None if d.get(k) is None else np.asarray(d[k], dtype=np.float32)  # noqa: E731
        return cls(get("mean"), get("std"), get("q01"), get("q99"))

    def to_dict(self) -> dict:
        return {k: v.tolist() for k, v in vars(self).items() if v is not None}


@dataclass
class Normalizer:
    """Normalises the robot state and un-normalises actions, one mode for both."""

    mode: str = "identity"
    state: Stats = field(default_factory=Stats)
    actions: Stats = field(default_factory=Stats)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"normalisation mode must be one of {MODES}, got {self.mode!r}")
        for name in ("state", "actions"):
            self._check(name, getattr(self, name))

    def _check(self, name: str, s: Stats) -> None:
        need = {"mean_std": ("mean", "std"), "quantile": ("q01", "q99")}.get(self.mode, ())
        missing = [k for k in need if getattr(s, k) is None]
        if missing:
            raise ValueError(f"{self.mode} normalisation needs {name} statistics {missing}")

    def normalize_state(self, x: np.ndarray) -> np.ndarray:
        return self._apply(np.asarray(x, dtype=np.float32), self.state, forward=True)

    def unnormalize_actions(self, x: np.ndarray) -> np.ndarray:
        return self._apply(np.asarray(x, dtype=np.float32), self.actions, forward=False)

    def _apply(self, x: np.ndarray, s: Stats, forward: bool) -> np.ndarray:
        if self.mode == "identity":
            return x.copy()
        a, b = (s.mean, s.std + EPS) if self.mode == "mean_std" else (s.q01, s.q99 - s.q01 + EPS)
        d = min(a.shape[-1], x.shape[-1])
        out = x.copy()
        if self.mode == "mean_std":
            out[..., :d] = (x[..., :d] - a[:d]) / b[:d] if forward else x[..., :d] * b[:d] + a[:d]
        else:
            out[..., :d] = (x[..., :d] - a[:d]) / b[:d] * 2 - 1 if forward else (x[..., :d] + 1) / 2 * b[:d] + a[:d]
        return out

    # ---- files ---------------------------------------------------------------------------
    def save(self, path: str | Path) -> None:
        """openpi's norm_stats.json layout, plus the mode."""
        data = {"norm_stats": {"state": self.state.to_dict(), "actions": self.actions.to_dict()}, "mode": self.mode}
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(data, indent=2))

    @classmethod
    def load(cls, path: str | Path, mode: str | None = None) -> Normalizer:
        data = json.loads(Path(path).read_text())
        stats = data.get("norm_stats", data)
        if "state" not in stats or "actions" not in stats:
            raise ValueError(f"{path}: expected norm_stats with 'state' and 'actions', got {sorted(stats)}")
        mode = mode or data.get("mode", "quantile")
        return cls(mode, Stats.from_dict(stats["state"]), Stats.from_dict(stats["actions"]))

    @classmethod
    def find(cls, folder: str | Path, mode: str | None = None) -> Normalizer | None:
        """norm_stats.json in the folder or under assets/<id>/ (openpi), if any."""
        folder = Path(folder)
        hits = [folder / "norm_stats.json", *sorted(folder.glob("assets/*/norm_stats.json"))]
        for p in hits:
            if p.is_file():
                return cls.load(p, mode)
        return None
