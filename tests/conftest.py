"""Shared fixtures: tiny random checkpoints saved with save_pretrained and loaded through our loader."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("OMP_NUM_THREADS", "1")  # tiny models: thread hand-offs cost more than they save

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)

from fafo.engine.engine import Engine  # noqa: E402
from fafo.engine.tiny import tiny_checkpoint  # noqa: E402

# name -> build_tiny_checkpoint kwargs. MHA and GQA, Llama and Qwen2 (qkv bias), rope scaling types.
MODEL_SPECS = {
    "llama_mha": dict(family="llama", num_attention_heads=4, num_key_value_heads=4, seed=1),
    "llama_gqa": dict(family="llama", num_attention_heads=4, num_key_value_heads=2, seed=2),
    "qwen2_gqa": dict(family="qwen2", num_attention_heads=4, num_key_value_heads=2, seed=3, tie_word_embeddings=True),
    "llama3_rope": dict(family="llama", seed=4, rope_parameters={
        "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 64}),
    "yarn_rope": dict(family="llama", seed=5, rope_parameters={
        "rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 64}),
    "linear_rope": dict(family="llama", seed=6, rope_parameters={
        "rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}),
    # dynamic NTK only changes frequencies past max_position_embeddings: tests go beyond 64 positions
    "dynamic_rope": dict(family="llama", seed=7, max_position_embeddings=64, rope_parameters={
        "rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}),
    "mistral_gqa": dict(family="mistral", seed=8, num_attention_heads=4, num_key_value_heads=1),
    # non-zero biases (transformers draws zeros): Qwen2's q/k/v, Llama's attention_bias (q/k/v and o); a head_dim
    # that is not hidden_size / heads (32, not 16)
    "qwen2_bias": dict(family="qwen2", num_attention_heads=4, num_key_value_heads=2, seed=9, bias_std=0.2),
    "llama_bias": dict(family="llama", num_attention_heads=4, num_key_value_heads=2, seed=10, attention_bias=True,
                       bias_std=0.2, head_dim=32),
    # default-ish init: these degenerate into repetition, so n-gram methods reach high acceptance
    "llama_mha_rep": dict(family="llama", num_attention_heads=4, num_key_value_heads=4, seed=3,
                          initializer_range=0.05),
    "qwen2_gqa_rep": dict(family="qwen2", num_attention_heads=4, num_key_value_heads=2, seed=3,
                          initializer_range=0.05),
}
DECODING_MODELS = ["llama_mha", "llama_gqa", "qwen2_gqa"]
# varied text (acceptance near zero) and repetitive text (acceptance high), MHA and GQA, Llama and Qwen2
LOSSLESS_MODELS = ["llama_mha", "llama_gqa", "qwen2_gqa", "llama_mha_rep", "qwen2_gqa_rep"]


# The compat tier (make test-compat: the oldest supported torch and transformers) runs the fast tier plus these
# slow tests: the compiled CPU paths (the path CUDA runs: aot_eager + FlexAttention; inductor code generation) and
# the CLI as a subprocess. So are the tests marked compat_env, and the slow tests marked compat where they are
# written (tests/test_optional_extras.py, tests/test_compat_stack.py).
COMPAT_SLOW = (
    "tests/test_compiled.py::test_compiled_flex_is_token_identical_and_compiles_once",
    "tests/test_compiled.py::test_live_length_is_read_from_tensors",
    "tests/test_compiled.py::test_runner_compiles_in_warmup_only",
    "tests/test_attention_paths.py::test_compiled_sdpa_reads_only_the_live_prefix_and_compiles_once",
    "tests/test_attention_paths.py::test_cli_runs_fafo_on_each_path",
    "tests/test_runner.py::test_cli_prints_one_error_line_and_exits_2",
    "tests/test_gpu_readiness.py::test_main_comparison_compiled_is_token_identical_without_compiling_while_timed",
)
COMPAT_PYTHON = "FAFO_COMPAT_PYTHON"  # the compat environment's interpreter, set by make test-compat
# Tests of an optional feature whose extra a GPU image lacks (and so the compat environment): the full tier runs
# them; the compat tier deselects them while the module is absent and runs tests/test_optional_extras.py instead.
NEEDS_EXTRA = {
    "tests/test_runner.py::test_user_prompts_file_and_wandb_offline_log": "wandb",
    "tests/test_bad_input.py::test_unreachable_hub_fails_fast": "datasets",
    "tests/test_task_loaders.py::test_offline_hub_id_is_one_clear_error": "datasets",
}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Mark the compat tier's slow tests. Deselect (not skip), so that each tier's count says what it ran: without
    ``FAFO_COMPAT_PYTHON``, the tests that need the compat environment; with it, the tests of an extra it lacks."""
    from fafo.extras import available

    chosen = set(COMPAT_SLOW)
    for item in items:
        if item.nodeid.split("[")[0] in chosen or item.get_closest_marker("compat_env"):
            item.add_marker(pytest.mark.compat)
    if os.environ.get(COMPAT_PYTHON):
        drop = [item for item in items
                if (module := NEEDS_EXTRA.get(item.nodeid.split("[")[0])) and not available(module)]
    else:
        drop = [item for item in items if item.get_closest_marker("compat_env")]
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = [item for item in items if item not in drop]


@pytest.fixture(scope="module")
def tok():
    """The embedded tiny tokenizer (its chat template renders ``<s><|user|>\\n{content}<|end|>\\n``)."""
    from fafo.engine.tiny_tokenizer import build_tiny_tokenizer

    return build_tiny_tokenizer()


@pytest.fixture(scope="session")
def ckpt_root(tmp_path_factory):
    return tmp_path_factory.mktemp("ckpts")


@pytest.fixture(scope="session")
def checkpoint(ckpt_root):
    """checkpoint(name) -> directory of a saved tiny model (built once per session)."""

    def get(name: str):
        return tiny_checkpoint(MODEL_SPECS[name], cache_dir=ckpt_root)

    return get


@pytest.fixture(scope="session")
def engine(checkpoint):
    """engine(name, backend) -> Engine loaded from the saved directory, float32 on CPU (cached)."""
    cache = {}

    def get(name: str, backend: str = "sdpa") -> Engine:
        if (name, backend) not in cache:
            cache[name, backend] = Engine.from_pretrained(str(checkpoint(name)), backend=backend)
        return cache[name, backend]

    return get


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook; the suite also runs without it, on one process
def pytest_xdist_auto_num_workers(config):
    """``-n auto`` (make test): one worker per usable CPU, at most 4 (each worker loads its own models and starts
    its own CLI subprocesses). xdist's own count is psutil's physical cores (1 on a VM of 2 hyperthreads), blind to
    a container's cpuset."""
    from tests.helpers import usable_cpus

    if env := os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return int(env)
    return min(4, usable_cpus())


def prompt_ids(engine_: Engine, text: str) -> list[int]:
    return engine_.tokenizer(text).input_ids


@pytest.fixture
def set_seed():
    torch.manual_seed(0)


@pytest.fixture(scope="module")
def law(ckpt_root):
    """law(model) -> (engine, prompt ids, exact joint law of its first tokens): tests/sampling_law.py."""
    from tests.sampling_law import exact_laws

    return exact_laws(ckpt_root)


@pytest.fixture
def fresh_dynamo():
    """A compiler with no graphs and zeroed counters, reset again afterwards."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()
