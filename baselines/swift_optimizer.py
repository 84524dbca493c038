"""SWIFT's on-the-fly layer-set optimisation (Xia et al., ICLR 2025, https://arxiv.org/abs/2410.06916,
Sec. 4.1).

Mirrors hemingkx/SWIFT @88caed7, ``model/swift/utils.py`` (``swift_optimization``, ``layer_random_search``,
``layer_bayes_search``, ``get_next_point_to_probe``) and the optimiser set-up in
``evaluation_llama/inference_swift.py``. The search space is the attention and the MLP sub-layer of layers
``1 .. L-2``: dimension ``x_i``, ``i < L-2``, is attention layer ``i+1``; ``x_{L-2+i}`` is MLP layer ``i+1``. Each
iteration proposes ``k = int(2(L-2) r)`` skipped sub-layers (a Bayesian-optimisation suggestion every
``bayes_interval``-th iteration, a random k-subset otherwise), the decoder scores it and :meth:`LayerSetOptimizer.
update` keeps it if it beats the best score so far. Official behaviours kept on purpose and where we differ:
docs/methods/swift.md.
"""

from __future__ import annotations

import contextlib
import io
from dataclasses import dataclass, field

import numpy as np

from fafo.extras import require


@dataclass
class LayerSetOptimizer:
    """Random search + periodic Bayesian-optimisation suggestions over the skipped sub-layer set.

    Attributes:
        n_layers: L, transformer layers of the model; the others are :class:`~baselines.swift.SwiftDecoder`'s
            settings of the same names (``bayes_interval``: iteration i asks the optimiser when
            ``(i + 1) % bayes_interval == 0``; the search stops after ``opt_iter > max_opt_iter``, more than
            ``max_tolerance_iter`` iterations in a row without improvement, or a kept score above ``max_score``).
    """

    n_layers: int
    skip_ratio: float = 0.45
    bayes_interval: int = 25
    max_opt_iter: int = 1000
    max_tolerance_iter: int = 300
    max_score: float = 0.95
    bayes: bool = True
    seed: int = 2024
    attn: frozenset = field(init=False)
    mlp: frozenset = field(init=False)

    def __post_init__(self):
        self.reset()

    @property
    def dims(self) -> int:
        return 2 * max(self.n_layers - 2, 0)

    @property
    def n_skip(self) -> int:
        """k = int(2(L-2) r) sub-layers skipped by every candidate (official ``skip_layer_num``)."""
        return int(self.dims * self.skip_ratio)

    def reset(self, attn=None, mlp=None) -> None:
        """Fresh state: the given (or the odd-layer) skip set, best score 0, a new optimiser and RNG."""
        odd = range(1, self.n_layers - 1, 2)  # the official unified start: the odd layers 1, 3, ... < L-1
        self.attn = frozenset(odd if attn is None else attn)
        self.mlp = frozenset(odd if mlp is None else mlp)
        self.best_score = 0.0  # official statistics["origin_score"]
        self.opt_iter = self.tolerance_iter = 0
        self.active = self.dims > 0  # a 2-layer model has nothing to search
        self.history: list[dict] = []  # one entry per iteration: the candidate, its score, kept or not
        self.rng = np.random.RandomState(self.seed)
        self._bo = None  # built on first use (imports bayes_opt, an optional extra, and scikit-learn)

    @property
    def skip(self) -> tuple[frozenset, frozenset]:
        """The current (best) set as the engine's ``skip=(attention layers, MLP layers)``."""
        return self.attn, self.mlp

    def _optimizer(self):
        if self._bo is None:
            require("bayes_opt", "method.bayes=true", "method.bayes=false: random search only")
            from bayes_opt import BayesianOptimization, acquisition

            pbounds = {f"x{i}": (0.0, 1.0) for i in range(self.dims)}
            self._bo = BayesianOptimization(f=None, pbounds=pbounds,
                                            acquisition_function=acquisition.UpperConfidenceBound(kappa=2.5),
                                            random_state=self.seed, verbose=0, allow_duplicate_points=True)
            self._bo.set_gp_params(alpha=1e-2)
        return self._bo

    def _sets(self, chosen) -> tuple[frozenset, frozenset]:
        """Dimension indices -> (attention layers, MLP layers)."""
        half, chosen = self.n_layers - 2, list(chosen)
        return (frozenset(int(d) + 1 for d in chosen if d < half),
                frozenset(int(d) - half + 1 for d in chosen if d >= half))

    def _point(self, attn, mlp) -> dict[str, float]:
        """A skip set as the optimiser's 0/1 point (official ``get_next_point_to_probe``)."""
        half = self.n_layers - 2
        return {f"x{i}": float((i + 1) in attn if i < half else (i - half + 1) in mlp)
                for i in range(self.dims)}

    def propose(self) -> dict:
        """The next candidate: ``{"kind": "bayes"|"random", "attn", "mlp", "point"}``."""
        if self.bayes and (self.opt_iter + 1) % self.bayes_interval == 0:
            point = {key: float(v) for key, v in self._optimizer().suggest().items()}
            ranked = sorted(point, key=point.get, reverse=True)[: self.n_skip]  # the k largest coordinates
            attn, mlp = self._sets([int(key[1:]) for key in ranked])
            return {"kind": "bayes", "attn": attn, "mlp": mlp, "point": point}
        attn, mlp = self._sets(self.rng.choice(self.dims, self.n_skip, replace=False))
        return {"kind": "random", "attn": attn, "mlp": mlp, "point": self._point(attn, mlp)}

    def update(self, candidate: dict, score: float) -> bool:
        """Register ``score`` and keep the candidate if it beats the best so far; returns whether it was kept.

        The official bookkeeping: improvement resets the tolerance (and stops the search above ``max_score``);
        otherwise the previous set stays and the tolerance grows; the iteration counter always grows.
        """
        if self.bayes:
            with contextlib.redirect_stdout(io.StringIO()):  # it prints every duplicate point it is given
                self._optimizer().register(params=candidate["point"], target=float(score))
        kept = score > self.best_score
        if kept:
            self.attn, self.mlp, self.best_score = candidate["attn"], candidate["mlp"], float(score)
            self.tolerance_iter = 0
            if score > self.max_score:
                self.active = False
        else:
            self.tolerance_iter += 1
        self.history.append({"iter": self.opt_iter, "kind": candidate["kind"],
                             "attn": sorted(candidate["attn"]), "mlp": sorted(candidate["mlp"]),
                             "score": float(score), "kept": kept})
        self.opt_iter += 1
        if self.tolerance_iter > self.max_tolerance_iter or self.opt_iter > self.max_opt_iter:
            self.active = False
        return kept

    def state(self) -> dict:
        """JSON-serialisable summary (for ``Generation.extras``)."""
        return {"skip_attn": sorted(self.attn), "skip_mlp": sorted(self.mlp), "best_score": self.best_score,
                "opt_iter": self.opt_iter, "tolerance_iter": self.tolerance_iter, "optimizing": self.active}
