"""The GPU self-check of a new node: ``python -m fafo.bench.gpu_check --out DIR``.

Run from a source checkout on a fresh GPU machine with no network (``PYTHONPATH=.`` plus the pure-Python wheels
the stack lacks, ``scripts/gpu_wheels.sh``), it says in under 8 minutes on one H100 whether the harness's
numbers can be trusted there. Stages, in order of value, each with its own time budget (a stage that runs out
stops, and what it did not run is named):

1. ``preflight``: versions, GPU, driver, the copy bandwidth, one block mask and one compiled FlexAttention call;
2. ``correctness``: compiled + CUDA-graph steps token-identical to eager on small random models of GQA groups
   1, 3, 4 and 7, for vanilla and every draftless method; no recompile after warm-up; no CUDA-graph skip;
   float16 mismatches classified (tie / divergence);
3. ``decode``: vanilla decode of a Llama-2-7B-shaped float16 model (random weights made on the GPU) at 512 and
   4096 context against the measured roofline and transformers' compiled static-cache ``generate``;
4. ``curve`` and ``methods``: the compiled cost curve (1..512 tokens per forward at 512, 4096 and 2048 context)
   and each method's step and host time per step, written as ``DIR/<gpu>.csv`` (``bench.cost_curve`` reads it);
   ``--method-layers N`` times the methods on the same widths with N layers (host times as on the whole model,
   compiles several times faster);
5. ``cli``: one comparison through ``python -m fafo.bench`` on a tiny model (vanilla, fafo_stream, prompt_lookup,
   lookahead; W&B off).

Stages 1-4 import only the engine, the decoders and the timing code: no Hydra, no OmegaConf. It writes
``DIR/gpu_check.md`` (the report, tracebacks included), the CSVs (``correctness.csv``, ``decode.csv``,
``<gpu>.csv``, ``cli_compare.csv``), and prints the short table last. ``--device cpu --quick`` runs the same
stages at toy sizes (the compiled CUDA path traced by ``aot_eager``), as the test suite does.
"""

from fafo.bench.gpu_check.run import main, run_check  # noqa: F401
