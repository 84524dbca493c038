"""Optional features and the pip extra that installs each.

A run needs torch, transformers, hydra-core and omegaconf (``pyproject.toml``'s core dependencies). The modules
below are imported only by the feature that uses them, so a GPU node with only the core installed runs everything
else; asking for a feature whose module is absent is one :class:`~fafo.errors.ConfigError` line naming the extra.
"""

from __future__ import annotations

import importlib.util

from fafo.errors import ConfigError

# module -> (the PyPI distribution, the extra of pyproject.toml that installs it)
EXTRAS = {
    "wandb": ("wandb", "wandb"),
    "gguf": ("gguf", "gguf"),
    "bayes_opt": ("bayesian-optimization", "swift"),
    "datasets": ("datasets", "datasets"),
    "pyarrow": ("pyarrow", "datasets"),
}


def install_hint(module: str) -> str:
    """The command that installs ``module``'s extra into the project's environment."""
    return f"pip install -c constraints.txt -e '.[{EXTRAS[module][1]}]'"


def available(module: str) -> bool:
    """Whether ``module`` is installed, found without importing it (bayes_opt alone imports scikit-learn: seconds)."""
    return importlib.util.find_spec(module) is not None


def require(module: str, feature: str, otherwise: str | None = None) -> None:
    """ConfigError ``<feature> needs the <package> package; pip install ... [(or <otherwise>)]`` when ``module``
    does not import."""
    if not available(module):
        alternative = f" (or {otherwise})" if otherwise else ""
        raise ConfigError(f"{feature} needs the {EXTRAS[module][0]} package; {install_hint(module)}{alternative}")
