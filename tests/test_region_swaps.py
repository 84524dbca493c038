"""``scripts/bench_region_swaps.py``: the swap lists it times are FixedRegion's layout, padded and compact lists
leave the same cache, and its command line writes one row per fraction and variant (no timings asserted)."""

import csv
import subprocess
import sys

import torch

from tests.helpers import REPO, import_script

swaps = import_script("bench_region_swaps")


def test_swap_lists_exchange_distinct_region_and_outside_slots_and_pair_the_kept_slots_with_themselves():
    L, H, width, real, slots = 3, 2, 8, 5, 40
    src, dst = swaps.swap_lists(L, H, width, real, slots, torch.Generator().manual_seed(1))
    assert src.shape == dst.shape == (L, H, 2 * width)
    out, into = src[..., :width], src[..., width:]
    assert torch.equal(dst, torch.cat([into, out], -1))  # each pair swaps: out -> into and into -> out
    assert bool((out[..., :real] < width).all()) and bool((into[..., :real] >= width).all())
    assert bool((into[..., :real] < slots).all())
    for row in torch.cat([out[..., :real], into[..., :real]], -1).view(L * H, -1):  # every slot in one pair at most
        assert row.unique().numel() == 2 * real
    assert torch.equal(out[..., real:], into[..., real:])  # the other pairs: a kept region slot with itself
    assert torch.equal(out.sort(-1).values, torch.arange(width).expand(L, H, -1))  # every region slot once


def test_swap_lists_that_move_every_entry_use_every_region_slot_and_every_slot_past_it():
    width = 6
    src, _ = swaps.swap_lists(2, 2, width, width, 2 * width, torch.Generator().manual_seed(3))
    assert torch.equal(src[..., :width].sort(-1).values, torch.arange(width).expand(2, 2, -1))
    assert torch.equal(src[..., width:].sort(-1).values, torch.arange(width, 2 * width).expand(2, 2, -1))


def test_move_rows_with_the_lists_swaps_exactly_the_listed_entries():
    L, H, width, real, slots, D = 2, 2, 4, 3, 16, 2
    src, dst = swaps.swap_lists(L, H, width, real, slots, torch.Generator().manual_seed(2))
    cache = swaps.KVCache(L, 1, H, slots, D, torch.float32, "cpu")
    cache.kv.normal_()
    before = cache.kv.clone()
    cache.move_rows(src, dst)
    expected = before.clone()
    for layer in range(L):
        for head in range(H):
            for a, b in zip(src[layer, head, :real].tolist(), src[layer, head, width:width + real].tolist()):
                expected[:, layer, 0, head, a], expected[:, layer, 0, head, b] = before[:, layer, 0, head, b], \
                    before[:, layer, 0, head, a]
    assert torch.equal(cache.kv, expected)


def test_command_line_writes_padded_and_compact_rows_per_fraction(tmp_path):
    out = tmp_path / "swaps.csv"
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "bench_region_swaps.py"), "--device", "cpu",
                           "--layers", "2", "--kv-heads", "2", "--head-dim", "8", "--slots", "64", "--width", "16",
                           "--fractions", "0.25", "1", "--repeats", "2", "--threads", "1", "--out", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    rows = list(csv.DictReader(out.open()))
    assert [(r["fraction"], r["variant"], r["real_pairs"]) for r in rows] == [
        ("0.25", "padded", "4"), ("0.25", "compact", "4"), ("1.0", "padded", "16"), ("1.0", "compact", "16")]
    for padded, compact in zip(rows[::2], rows[1::2]):
        row = 2 * 8 * 4  # a key and a value row of 8 float32 values
        per_pair = 2 * 2 * 2 * row  # 2 layers x 2 KV heads x the pair's two entries
        assert int(padded["moved_bytes"]) == int(compact["moved_bytes"]) == int(padded["real_pairs"]) * per_pair
        assert int(padded["listed_bytes"]) == 16 * per_pair  # every listed pair, padding included
        assert int(compact["listed_bytes"]) == int(compact["moved_bytes"])
        assert float(padded["median_ms"]) > 0 and float(compact["median_ms"]) > 0
    assert "| 0.25 | 4 |" in proc.stdout


def test_command_line_refuses_a_region_wider_than_the_slots_past_it(tmp_path):
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "bench_region_swaps.py"), "--device", "cpu",
                           "--slots", "64", "--width", "40", "--out", str(tmp_path / "x.csv")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "--width 40" in proc.stderr and "raise --slots" in proc.stderr
    assert not (tmp_path / "x.csv").exists()
