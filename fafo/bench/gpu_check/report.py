"""The check's Markdown report (``gpu_check.md``) and the short table printed last."""

from __future__ import annotations

from pathlib import Path

STAGE_TITLES = {
    "preflight": "1. Preflight: versions, copy bandwidth, one compiled FlexAttention call",
    "correctness": "2. Compiled steps token-identical to eager (GQA groups x draftless methods)",
    "decode": "3. Vanilla decode of the 7B-shaped model: roofline and transformers",
    "curve": "4a. Compiled cost curve",
    "methods": "4b. Each method's compiled step time and host time per step",
    "cli": "5. One comparison through the command line",
}


def markdown_table(columns, rows: list[dict]) -> str:
    """``rows`` (dicts) as a Markdown table of ``columns``; a missing cell is empty."""
    return ("| " + " | ".join(columns) + " |\n|" + "---|" * len(columns) + "\n"
            + "".join("| " + " | ".join(str(r.get(c, "")) for c in columns) + " |\n" for r in rows))


def overall(results) -> str:
    """The verdict over the stages that were selected (``--stages``); the others are named as such."""
    if any(r.status == "failed" for r in results):
        return "FAILED"
    if any(r.status in ("partial", "skipped") for r in results):
        return "INCOMPLETE (stages or items skipped for time)"
    left_out = [r.name for r in results if r.status == "not selected"]
    return "PASSED" + (f" (stages not selected: {', '.join(left_out)})" if left_out else "")


def write_report(path: Path, results, settings, argv: list[str], total_s: float) -> str:
    """Write the report; returns the short table (also its first section)."""
    short = short_table(results, settings, total_s)
    parts = [f"# GPU self-check: {overall(results)}\n", f"`python -m fafo.bench.gpu_check {' '.join(argv)}`\n",
             f"Device {settings.device}, {settings.dtype}, compiled steps {settings.compile_label}, "
             f"{'quick' if settings.quick else 'full'} sizes, {total_s:.0f} s in all.\n", "## Summary\n", short]
    for r in results:
        parts.append(f"## {r.title}\n")
        parts.append(f"Status: **{r.status}**, {r.seconds:.0f} s of a {r.budget_s:.0f} s budget. {r.summary}\n")
        if r.failed_checks:
            parts.append("Failed checks:\n\n" + "".join(f"- {c}\n" for c in r.failed_checks))
        parts.extend(s + "\n" for s in r.sections)
        if r.skipped:
            parts.append("Not run for lack of time: " + ", ".join(r.skipped) + "\n")
        for err in r.errors:
            parts.append("```\n" + err.rstrip() + "\n```\n")
    path.write_text("\n".join(parts))
    return short


def short_table(results, settings, total_s: float) -> str:
    lines = ["| stage | status | s / budget | result |", "|---|---|---|---|"]
    for r in results:
        what = r.summary or (r.failed_checks[0] if r.failed_checks else "")
        if r.skipped:
            what += f" [not run: {len(r.skipped)}: {', '.join(r.skipped[:4])}{', ...' if len(r.skipped) > 4 else ''}]"
        lines.append(f"| {r.name} | {r.status} | {r.seconds:.0f} / {r.budget_s:.0f} | {what} |")
    lines.append(f"\n{overall(results)} in {total_s:.0f} s on {settings.device} ({settings.compile_label})")
    return "\n".join(lines) + "\n"
